// Renders chat-template cases with runtime/data/jinja.h, one JSON object a
// line on stdin ({"template": "...", "vars": {...}}), one a line on stdout:
// {"out": "..."} or {"error": "..."}. For jinja_reference_test.py.
#include <iostream>
#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/data/jinja.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json result;
    const nlohmann::ordered_json c =
        nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!c.is_object() || !c.contains("template") || !c["template"].is_string()) {
      result["error"] = "bad case";
      std::cout << result.dump() << "\n";
      continue;
    }
    std::map<std::string, loom::jinja::Value> vars;
    if (c.contains("vars")) {
      absl::StatusOr<loom::jinja::Value> v = loom::jinja::Value::FromJson(c["vars"].dump());
      if (v.ok() && v->is_dict()) {
        for (const auto& [k, x] : v->dict()) vars[k] = x;
      }
    }
    absl::StatusOr<std::unique_ptr<loom::jinja::Template>> t =
        loom::jinja::Template::Parse(c["template"].get<std::string>());
    absl::StatusOr<std::string> out =
        t.ok() ? (*t)->Render(vars) : absl::StatusOr<std::string>(t.status());
    if (out.ok()) {
      result["out"] = *out;
    } else {
      result["error"] = std::string(out.status().message());
    }
    std::cout << result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
