// describe_cli: the manual pages and the bash completion of the pgmutex
// command, written from the very CLI11 app the command parses with, so that
// `man pgmutex-run`, `pgmutex run --help` and <TAB> cannot disagree.
//   describe_cli man OUTDIR SUBCOMMAND...   OUTDIR/pgmutex.1 and OUTDIR/pgmutex-SUBCOMMAND.1
//   describe_cli bash-completion FILE        the completion script (complete -F _pgmutex pgmutex)
// The build lists the subcommands it installs a page for; a subcommand the
// app has and the list lacks (or the reverse) fails the build instead of
// going without a page.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "command_line.hpp"
#include "version.hpp"

namespace {

// The app as `pgmutex` builds it (parsing --version only fills it in).
std::unique_ptr<CLI::App> pgmutex_app() {
  const char* argv[] = {"pgmutex", "--version"};
  std::ostringstream ignored;
  return pgmutex::cli::parse_command_line(2, argv, ignored, ignored).app;
}

std::vector<CLI::App*> subcommands_of(CLI::App& app) {
  return app.get_subcommands([](CLI::App*) { return true; });
}

// Options --help shows (CLI11 hides those with an empty group).
std::vector<const CLI::Option*> shown_options(const CLI::App& app, bool positional) {
  return app.get_options([&](const CLI::Option* option) {
    return !option->get_group().empty() && option->nonpositional() != positional;
  });
}

std::vector<std::string> names_of(const CLI::Option& option) {
  std::vector<std::string> names;
  for (const std::string& name : option.get_snames()) names.push_back("-" + name);
  for (const std::string& name : option.get_lnames()) names.push_back("--" + name);
  return names;
}

// A flag (--wait) expects no value; CLI11 marks it with expected(0).
bool takes_value(const CLI::Option& option) { return option.get_expected_max() != 0; }

// "MODE:{auto,prepared,unnamed}" -> "MODE", and the choices.
std::string value_name(const CLI::Option& option) {
  std::string type = option.get_type_name();
  return type.substr(0, type.find(':'));
}
std::vector<std::string> choices_of(const CLI::Option& option) {
  const std::string type = option.get_type_name();
  const auto open = type.find('{');
  const auto close = type.find('}', open);
  std::vector<std::string> choices;
  if (open == std::string::npos || close == std::string::npos) return choices;
  std::istringstream list(type.substr(open + 1, close - open - 1));
  for (std::string choice; std::getline(list, choice, ',');) choices.push_back(choice);
  return choices;
}

// ---- roff ----

// Text as roff prints it: backslashes and hyphens escaped (\- so that the
// flags a reader copies are ASCII), and no line starting as a request.
std::string roff(std::string_view text) {
  std::string out;
  bool line_start = true;
  for (char c : text) {
    if (line_start && (c == '.' || c == '\'')) out += "\\&";
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
    line_start = c == '\n';
  }
  return out;
}

std::string bold(std::string_view text) { return "\\fB" + roff(text) + "\\fR"; }
std::string italic(std::string_view text) { return "\\fI" + roff(text) + "\\fR"; }

std::string joined(const std::vector<std::string>& words, std::string_view separator) {
  std::string out;
  for (const std::string& word : words) out += (out.empty() ? "" : std::string(separator)) + word;
  return out;
}

std::string upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

std::string positional_name(const CLI::Option& option) {
  const std::string type = value_name(option);
  return type.empty() ? upper(option.get_name()) : type;
}

bool repeats(const CLI::Option& option) {
  return option.get_items_expected_max() > 1 || option.get_expected_max() > 1;
}

// The option's extras as --help prints them: default, environment, needs.
std::string extras_of(const CLI::Option& option) {
  std::string extras;
  if (!option.get_default_str().empty()) extras += " [default: " + option.get_default_str() + "]";
  if (!option.get_envname().empty()) extras += " [env: " + option.get_envname() + "]";
  for (const CLI::Option* needed : option.get_needs()) extras += " [needs " + needed->get_name() + "]";
  if (option.get_required()) extras += " [required]";
  return extras;
}

std::string option_entry(const CLI::Option& option) {
  std::string head;
  for (const std::string& name : names_of(option)) head += (head.empty() ? "" : ", ") + bold(name);
  if (takes_value(option) && !value_name(option).empty()) head += " " + italic(value_name(option));
  std::string body = option.get_description() + extras_of(option);
  if (const auto choices = choices_of(option); !choices.empty()) body += " (one of: " + joined(choices, ", ") + ")";
  return ".TP\n" + head + "\n" + roff(body) + "\n";
}

// A footer as written for --help: paragraphs kept line for line (they hold
// aligned examples); an "Examples:" paragraph becomes the EXAMPLES section.
std::string footer_sections(const std::string& footer) {
  std::string description, examples;
  std::istringstream in(footer);
  std::string paragraph, line;
  auto flush = [&] {
    if (paragraph.empty()) return;
    const std::string heading = "Examples:\n";
    if (paragraph.starts_with(heading)) examples += ".PP\n.nf\n" + roff(paragraph.substr(heading.size())) + ".fi\n";
    else description += ".PP\n.nf\n" + roff(paragraph) + ".fi\n";
    paragraph.clear();
  };
  while (std::getline(in, line)) {
    if (line.find_first_not_of(' ') == std::string::npos) flush();
    else paragraph += line + "\n";
  }
  flush();
  return description + (examples.empty() ? "" : ".SH EXAMPLES\n" + examples);
}

std::string title(std::string_view page) {
  return ".TH " + upper(roff(page)) + " 1 \"\" \"pgmutex " + std::string(pgmutex::cli::version) +
         "\" \"User Commands\"\n"
         // Flags and page names are words a reader copies: never hyphenated, never stretched.
         ".nh\n.ad l\n";
}

std::string see_also(CLI::App& app, std::string_view self) {
  std::vector<std::string> pages{"pgmutex"};
  for (CLI::App* sub : subcommands_of(app)) pages.push_back("pgmutex-" + sub->get_name());
  std::vector<std::string> refs;
  for (const std::string& page : pages)
    if (page != self) refs.push_back(bold(page) + "(1)");
  return ".SH SEE ALSO\n" + joined(refs, ",\n") + "\n";
}

std::string main_page(CLI::App& app) {
  std::string summary = app.get_description();
  if (summary.starts_with("pgmutex: ")) summary.erase(0, std::string_view("pgmutex: ").size());
  std::string page = title("pgmutex") + ".SH NAME\npgmutex \\- " + roff(summary) + "\n";
  page += ".SH SYNOPSIS\n" + bold("pgmutex") + " " + italic("SUBCOMMAND") + " [" + italic("OPTIONS") + "]\n.br\n" +
          bold("pgmutex") + " " + italic("SUBCOMMAND") + " " + bold("--help") + "\n.br\n" + bold("pgmutex") + " " +
          bold("--version") + "\n";
  std::string sentence = summary;
  if (!sentence.empty()) sentence[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(sentence[0])));
  page += ".SH DESCRIPTION\n" + roff(sentence) + ".\n";
  const std::string footer = footer_sections(app.get_footer());
  const auto examples = footer.find(".SH EXAMPLES\n");
  page += footer.substr(0, examples);
  page += ".SH SUBCOMMANDS\n";
  for (CLI::App* sub : subcommands_of(app))
    page += ".TP\n" + bold(sub->get_name()) + "\n" + roff(sub->get_description()) + "; see " +
            bold("pgmutex-" + sub->get_name()) + "(1).\n";
  page += ".SH OPTIONS\n";
  for (const CLI::Option* option : shown_options(app, false)) page += option_entry(*option);
  if (examples != std::string::npos) page += footer.substr(examples);
  return page + see_also(app, "pgmutex");
}

std::string subcommand_page(CLI::App& app, CLI::App& sub) {
  const std::string name = "pgmutex-" + sub.get_name();
  std::string page = title(name) + ".SH NAME\n" + roff(name) + " \\- " + roff(sub.get_description()) + "\n";
  std::string synopsis = bold("pgmutex " + sub.get_name());
  for (const CLI::Option* option : shown_options(sub, false))
    if (option->get_required()) {
      synopsis += " " + bold(names_of(*option).back());
      if (takes_value(*option)) synopsis += " " + italic(value_name(*option));
    }
  synopsis += " [" + italic("OPTIONS") + "]";
  for (const CLI::Option* option : shown_options(sub, true)) {
    std::string word = repeats(*option) ? bold("--") + " " + italic(positional_name(*option)) + "..."
                                        : italic(positional_name(*option));
    synopsis += " " + (option->get_required() ? word : "[" + word + "]");
  }
  page += ".SH SYNOPSIS\n" + synopsis + "\n";
  page += ".SH DESCRIPTION\n" + roff(sub.get_description()) + ".\n";
  const std::string footer = footer_sections(sub.get_footer());
  const auto examples = footer.find(".SH EXAMPLES\n");
  page += footer.substr(0, examples);
  if (const auto positionals = shown_options(sub, true); !positionals.empty()) {
    page += ".SH ARGUMENTS\n";
    for (const CLI::Option* option : positionals)
      page += ".TP\n" + italic(positional_name(*option)) + "\n" + roff(option->get_description() + extras_of(*option)) +
              "\n";
  }
  page += ".SH OPTIONS\n";
  for (const CLI::Option* option : shown_options(sub, false)) page += option_entry(*option);
  if (examples != std::string::npos) page += footer.substr(examples);
  return page + see_also(app, name);
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) std::fprintf(stderr, "describe_cli: cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

int write_man_pages(CLI::App& app, const std::string& outdir, std::vector<std::string> listed) {
  std::vector<std::string> actual;
  for (CLI::App* sub : subcommands_of(app)) actual.push_back(sub->get_name());
  std::sort(listed.begin(), listed.end());
  std::sort(actual.begin(), actual.end());
  if (listed != actual) {
    std::fprintf(stderr,
                 "describe_cli: the build lists the subcommands {%s} but pgmutex has {%s}: "
                 "update man_subcommands in tools/man/meson.build\n",
                 joined(listed, ",").c_str(), joined(actual, ",").c_str());
    return 1;
  }
  if (!write_file(outdir + "/pgmutex.1", main_page(app))) return 1;
  for (CLI::App* sub : subcommands_of(app))
    if (!write_file(outdir + "/pgmutex-" + sub->get_name() + ".1", subcommand_page(app, *sub))) return 1;
  return 0;
}

// ---- bash ----

std::string words_of(const std::vector<const CLI::Option*>& options) {
  std::vector<std::string> words;
  for (const CLI::Option* option : options)
    for (const std::string& name : names_of(*option)) words.push_back(name);
  return joined(words, " ");
}

// The `case $prev` arms: what follows a flag that takes a value.
std::string value_arms(const std::vector<const CLI::Option*>& options) {
  std::string arms;
  for (const CLI::Option* option : options) {
    if (!takes_value(*option)) continue;
    const std::string pattern = joined(names_of(*option), "|");
    if (const auto choices = choices_of(*option); !choices.empty())
      arms += "        " + pattern + ") COMPREPLY=($(compgen -W '" + joined(choices, " ") +
              "' -- \"$cur\")); return 0 ;;\n";
    else if (value_name(*option) == "PATH")
      arms += "        " + pattern + ") COMPREPLY=($(compgen -f -- \"$cur\")); return 0 ;;\n";
    else  // a name, a number, a DSN: nothing to offer, and not file names either
      arms += "        " + pattern + ") compopt +o default 2>/dev/null; return 0 ;;\n";
  }
  return arms;
}

std::string bash_completion(CLI::App& app) {
  std::vector<std::string> names;
  for (CLI::App* sub : subcommands_of(app)) names.push_back(sub->get_name());
  std::string script = R"(# bash completion for pgmutex: generated by tools/describe_cli.cpp from the
# flags the command itself registers (the ones `pgmutex SUBCOMMAND --help` lists).
_pgmutex() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local subcommand="" i
  for ((i = 1; i < COMP_CWORD; i++)); do
    if [[ ${COMP_WORDS[i]} == -- ]]; then
      # The command to run under the lock: a command name, then bash's default (files).
      ((i == COMP_CWORD - 1)) && COMPREPLY=($(compgen -c -- "$cur"))
      return 0
    fi
    [[ -z $subcommand && ${COMP_WORDS[i]} != -* ]] && subcommand=${COMP_WORDS[i]}
  done
  local options
  case $subcommand in
    "")
      options=')" + words_of(shown_options(app, false)) + R"('
      if [[ $cur != -* ]]; then
        COMPREPLY=($(compgen -W ')" + joined(names, " ") + R"(' -- "$cur"))
        return 0
      fi
      ;;
)";
  for (CLI::App* sub : subcommands_of(app)) {
    const auto options = shown_options(*sub, false);
    script += "    " + sub->get_name() + ")\n      options='" + words_of(options) + "'\n      case $prev in\n" +
              value_arms(options) + "      esac\n      ;;\n";
  }
  script += R"(    *) return 0 ;;
  esac
  if [[ -z $cur || $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$options" -- "$cur"))
  fi
  return 0
}
complete -o default -F _pgmutex pgmutex
)";
  return script;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto app = pgmutex_app();
  if (args.size() >= 2 && args[0] == "man")
    return write_man_pages(*app, args[1], std::vector<std::string>(args.begin() + 2, args.end()));
  if (args.size() == 2 && args[0] == "bash-completion") return write_file(args[1], bash_completion(*app)) ? 0 : 1;
  std::fprintf(stderr, "usage: describe_cli man OUTDIR SUBCOMMAND... | describe_cli bash-completion FILE\n");
  return 64;
}
