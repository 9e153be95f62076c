#include "outbox/pg_error.hpp"

#include <pqxx/pqxx>
#include <string>

namespace outlive::outbox {

void rethrow_as_error(std::string_view what) {
  const std::string prefix = std::string(what) + ": ";
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const pqxx::sql_error& e) {
    std::string state = e.sqlstate();
    // libpqxx 6 throws insufficient_privilege without its SQLSTATE; a writer refused an app
    // (docs/WRITERS.md) must still read [42501].
    if (state.empty() && dynamic_cast<const pqxx::insufficient_privilege*>(&e) != nullptr) {
      state = "42501";
    }
    // Class 22 (data exception) and 23 (integrity) are refused input; 42P01 a missing relation.
    if (state.rfind("22", 0) == 0 || state.rfind("23", 0) == 0 || state == "P0001") {
      throw Error(Errc::invalid_input, prefix + e.what());
    }
    if (state == "42P01" || state == "3F000" || state == "42883") {
      throw Error(Errc::not_migrated, prefix + e.what());
    }
    throw Error(Errc::database, prefix + "[" + state + "] " + e.what());
  } catch (const pqxx::broken_connection& e) {
    throw Error(Errc::database, prefix + "connection lost: " + e.what());
  } catch (const std::exception& e) {
    throw Error(Errc::database, prefix + e.what());
  }
}

bool from_database(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e))
    return error->code() == Errc::database || error->code() == Errc::timeout;
  return dynamic_cast<const pqxx::failure*>(&e) != nullptr;
}

}  // namespace outlive::outbox
