//===- CommandLine.cpp - The error style of meshplan's command lines -----===//

#include "CommandLine.h"

#include "meshplan/Support/Json.h"

#include <cerrno>
#include <cstdlib>
#include <iostream>

namespace meshplan::cli {

std::optional<std::string> unknownWord(CLI::App &app,
                                       const std::vector<char *> &args,
                                       const std::string &program) {
  CLI::App *current = &app;
  std::string path = program;
  int valuesNext = 0;
  for (size_t i = 1; i < args.size(); ++i) {
    std::string word = args[i];
    if (word == "--")
      break;
    if (valuesNext > 0) {
      --valuesNext;
      continue;
    }
    if (word.rfind("--", 0) == 0) {
      std::string name = word.substr(0, word.find('='));
      const CLI::Option *opt = nullptr;
      for (CLI::App *a = current; a && !opt; a = a->get_parent())
        opt = a->get_option_no_throw(name);
      if (!opt) {
        std::vector<std::string> names;
        for (CLI::App *a = current; a; a = a->get_parent())
          for (const CLI::Option *o : a->get_options())
            for (const std::string &l : o->get_lnames())
              names.push_back("--" + l);
        std::vector<std::string_view> views(names.begin(), names.end());
        return path + ": unknown flag " + meshplan::json::quote(name) +
               meshplan::json::didYouMean(name, views) + "; see '" + path +
               " --help'";
      }
      // A flag takes no value; an option one (or two, as a pair).
      valuesNext = word.find('=') == std::string::npos
                       ? std::max(opt->get_type_size(), 0)
                       : 0;
      continue;
    }
    if (word.size() > 1 && word[0] == '-') {
      // A short flag: "-o" takes a value, "-n" too; CLI11 knows which.
      const CLI::Option *opt = nullptr;
      for (CLI::App *a = current; a && !opt; a = a->get_parent())
        opt = a->get_option_no_throw(word.substr(0, 2));
      valuesNext =
          opt && word.size() == 2 ? std::max(opt->get_type_size(), 0) : 0;
      continue;
    }
    std::vector<CLI::App *> subs = current->get_subcommands({});
    if (subs.empty())
      continue; // a positional argument
    CLI::App *next = nullptr;
    std::vector<std::string> names;
    for (CLI::App *sub : subs) {
      names.push_back(sub->get_name());
      if (sub->check_name(word))
        next = sub;
    }
    if (!next) {
      std::vector<std::string_view> views(names.begin(), names.end());
      return path + ": unknown subcommand " + meshplan::json::quote(word) +
             meshplan::json::didYouMean(word, views) + "; expected one of " +
             meshplan::json::joinNames(names);
    }
    current = next;
    path += " " + next->get_name();
  }
  return std::nullopt;
}

std::optional<int> parseCommandLine(CLI::App &app, std::vector<char *> args,
                                    const std::string &program,
                                    const std::function<std::string()> &hint) {
  if (auto unknown = unknownWord(app, args, program)) {
    std::cerr << program << ": error: " << *unknown << "\n";
    return 2;
  }
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::Success &e) {
    return app.exit(e); // --help, --version
  } catch (const CLI::ParseError &e) {
    std::cerr << program << ": error: " << e.what();
    if (hint)
      std::cerr << hint();
    std::cerr << "\n";
    return 2;
  }
  return std::nullopt;
}

void addRenamedFlag(CLI::App *cmd, const std::string &name,
                    const std::string &message) {
  cmd->add_option_function<std::string>(name,
                                        [name, message](const std::string &) {
                                          throw CLI::ValidationError(name,
                                                                     message);
                                        })
      ->expected(0, 1)
      ->group(""); // hidden from --help
}

CLI::Validator integerIn(int64_t min, int64_t max) {
  std::string range =
      "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string &text) -> std::string {
        char *end = nullptr;
        errno = 0;
        long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end || errno || v < min || v > max)
          return "expected an integer in " + range + ", got \"" + text + "\"";
        return {};
      },
      "INT in " + range);
}

} // namespace meshplan::cli
