#include "schema/validator.hpp"

#include <set>
#include <utility>
#include <vector>

#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include "common/error.hpp"

namespace outlive::schema {

struct Validator::Impl {
  valijson::Schema schema;
  // A schema whose root is a oneOf/anyOf of alternatives, once per alternative (the root with only
  // that alternative, so $refs still resolve). A failure is explained by the alternative with the
  // fewest errors, not by the deepest error of any alternative (that would blame "/type" of the
  // item.deleted alternative for an item.changed update that lacks itemId).
  std::vector<std::unique_ptr<valijson::Schema>> alternatives;
};

namespace {

using Adapter = valijson::adapters::NlohmannJsonAdapter;

// valijson compiles a schema by recursion, one level or more of the stack per level of the
// schema: a schema nested this deep (far beyond any real one) is refused instead of exhausting
// the stack.
constexpr size_t kMaxSchemaDepth = 64;

std::optional<std::string> ref_of(const Adapter& node) {
  if (!node.isObject()) return std::nullopt;
  const auto object = node.getObject();
  const auto ref = object.find("$ref");
  std::string text;
  if (ref == object.end() || !ref->second.getString(text)) return std::nullopt;
  return text;
}

// valijson follows a $ref whose target is another $ref without remembering where it has been
// ("TODO: Need to detect degenerate circular references"), so a chain of them that comes back,
// {"not": {"$ref": "#/not"}} for one, recurses until the stack is gone. The chain is followed
// here the way valijson resolves it: the pointer after '#', trailing slashes trimmed, from the
// root, whatever the document part (a document of its own is never fetched).
void refuse_ref_cycle(const Adapter& root, const Adapter& start) {
  std::set<std::string> seen;
  std::optional<Adapter> node(start);  // an adapter holds a reference: emplaced, not assigned
  while (const auto ref = ref_of(*node)) {
    std::string pointer =
        valijson::internal::json_reference::getJsonReferencePointer(*ref).value_or(std::string());
    pointer.erase(pointer.find_last_not_of('/') + 1);
    if (!seen.insert(pointer).second) {
      throw Error(Errc::invalid_input,
                  "invalid JSON Schema: $ref \"" + *ref + "\" leads back to itself");
    }
    try {
      node.emplace(valijson::internal::json_pointer::resolveJsonPointer(root, pointer));
    } catch (const std::exception&) {
      return;  // a dangling $ref: valijson says so itself
    }
  }
}

// What valijson would recurse on until the stack is gone, refused with an error instead. The
// depth comes first: resolving a pointer recurses too.
void refuse_unbounded(const nlohmann::json& schema) {
  std::vector<const nlohmann::json*> refs;
  std::vector<std::pair<const nlohmann::json*, size_t>> pending{{&schema, 1}};
  while (!pending.empty()) {
    const auto [node, depth] = pending.back();
    pending.pop_back();
    if (!node->is_structured()) continue;
    if (depth > kMaxSchemaDepth) {
      throw Error(Errc::invalid_input, "invalid JSON Schema: nested deeper than " +
                                           std::to_string(kMaxSchemaDepth) + " levels");
    }
    for (const auto& child : *node) pending.emplace_back(&child, depth + 1);
    if (node->is_object() && node->contains("$ref")) refs.push_back(node);
  }
  const Adapter root(schema);
  for (const auto* node : refs) refuse_ref_cycle(root, Adapter(*node));
}

}  // namespace

Validator::Validator(const nlohmann::json& schema) : impl_(std::make_unique<Impl>()) {
  refuse_unbounded(schema);
  try {
    valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
    valijson::adapters::NlohmannJsonAdapter adapter(schema);
    parser.populateSchema(adapter, impl_->schema);
    for (const char* keyword : {"oneOf", "anyOf"}) {
      if (!schema.is_object() || !schema.contains(keyword) || !schema[keyword].is_array() ||
          schema[keyword].size() < 2) {
        continue;
      }
      try {
        for (const auto& alternative : schema[keyword]) {
          nlohmann::json single = schema;
          single[keyword] = nlohmann::json::array({alternative});
          refuse_unbounded(single);
          valijson::adapters::NlohmannJsonAdapter single_adapter(single);
          auto compiled = std::make_unique<valijson::Schema>();
          parser.populateSchema(single_adapter, *compiled);
          impl_->alternatives.push_back(std::move(compiled));
        }
      } catch (const std::exception&) {
        // Alone, an alternative that names another by its place ("#/oneOf/1") finds it gone, or
        // finds itself: such a schema is valid all the same, and its failures are explained by
        // the whole schema.
        impl_->alternatives.clear();
      }
      break;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(Errc::invalid_input, std::string("invalid JSON Schema: ") + e.what());
  }
}

Validator::~Validator() = default;
Validator::Validator(Validator&&) noexcept = default;
Validator& Validator::operator=(Validator&&) noexcept = default;

namespace {

std::string json_pointer(const std::vector<std::string>& context) {
  // valijson's context looks like ["<root>", "[items]", "[0]"]; turn it into /items/0.
  std::string path;
  for (const auto& part : context) {
    if (part == "<root>") continue;
    std::string p = part;
    if (p.size() >= 2 && p.front() == '[' && p.back() == ']') p = p.substr(1, p.size() - 2);
    if (p.size() >= 2 && p.front() == '"' && p.back() == '"') p = p.substr(1, p.size() - 2);
    path += "/" + p;
  }
  return path.empty() ? "/" : path;
}

}  // namespace

std::optional<std::string> Validator::check(const nlohmann::json& document) const {
  valijson::Validator validator;
  valijson::adapters::NlohmannJsonAdapter adapter(document);
  if (validator.validate(impl_->schema, adapter, nullptr)) return std::nullopt;
  // The alternative that came closest explains the failure (see Impl::alternatives).
  const valijson::Schema* explaining = &impl_->schema;
  size_t fewest = 0;
  for (const auto& alternative : impl_->alternatives) {
    valijson::ValidationResults r;
    validator.validate(*alternative, adapter, &r);
    if (explaining == &impl_->schema || r.numErrors() < fewest) {
      explaining = alternative.get();
      fewest = r.numErrors();
    }
  }
  valijson::ValidationResults results;
  validator.validate(*explaining, adapter, &results);
  // The deepest error names the most specific failing path.
  valijson::ValidationResults::Error error, best;
  size_t depth = 0;
  bool first = true;
  while (results.popError(error)) {
    if (first || error.context.size() > depth) {
      best = error;
      depth = error.context.size();
      first = false;
    }
  }
  return json_pointer(best.context) + ": " + best.description;
}

}  // namespace outlive::schema
