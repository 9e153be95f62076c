#include "schema/validator.hpp"

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

Validator::Validator(const nlohmann::json& schema) : impl_(std::make_unique<Impl>()) {
  try {
    valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
    valijson::adapters::NlohmannJsonAdapter adapter(schema);
    parser.populateSchema(adapter, impl_->schema);
    for (const char* keyword : {"oneOf", "anyOf"}) {
      if (!schema.is_object() || !schema.contains(keyword) || !schema[keyword].is_array() ||
          schema[keyword].size() < 2) {
        continue;
      }
      for (const auto& alternative : schema[keyword]) {
        nlohmann::json single = schema;
        single[keyword] = nlohmann::json::array({alternative});
        valijson::adapters::NlohmannJsonAdapter single_adapter(single);
        auto compiled = std::make_unique<valijson::Schema>();
        parser.populateSchema(single_adapter, *compiled);
        impl_->alternatives.push_back(std::move(compiled));
      }
      break;
    }
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
