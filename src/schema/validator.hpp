#pragma once
// JSON Schema (draft 7) validation, behind a plain header so valijson stays in one translation
// unit.
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace outlive::schema {

class Validator {
 public:
  // Throws outlive::Error(invalid_input) when `schema` is not a usable JSON Schema.
  explicit Validator(const nlohmann::json& schema);
  ~Validator();
  Validator(Validator&&) noexcept;
  Validator& operator=(Validator&&) noexcept;

  // nullopt when `document` satisfies the schema; otherwise the first failing path and reason,
  // like "/items/0/quantity: Value type not permitted by 'type' constraint."
  std::optional<std::string> check(const nlohmann::json& document) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::schema
