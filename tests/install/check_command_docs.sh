#!/usr/bin/env bash
# check_command_docs.sh ROOT BINDIR MANDIR DATADIR: the installed manual pages
# and bash completion of the pgmutex command agree with its --help: a page per
# subcommand --help lists, each renders without a warning (groff -ww), names
# every flag that subcommand's --help names and has an entry for each of its
# options, and the completion completes subcommands, their flags and flag values.
set -euo pipefail
root=$1 bindir=$2 mandir=$3 datadir=$4
pgmutex="$root/$bindir/pgmutex"
completion="$root/$datadir/bash-completion/completions/pgmutex"
man1="$root/$mandir/man1"

fail() { echo "check_command_docs: $*" >&2; exit 1; }
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT

# The subcommands, as `pgmutex --help` lists them (CLI11: an indented name and
# its description, under "Subcommands:" or "SUBCOMMANDS:").
subcommands=$("$pgmutex" --help | awk 'tolower($0) ~ /^subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1; next} on && /^[^ ]/ {on=0}')
[ -n "$subcommands" ] || fail "pgmutex --help lists no subcommands"

# Every --flag a help text names (descriptions mention some: they must be documented too).
flags_of() { grep -oE -- '--[a-z][a-z0-9-]+' | sort -u; }

# The flags a help text lists as options (the lines that begin with them).
option_flags() { grep -oE -- '^ +(-[a-zA-Z],)?--[a-z][a-z0-9-]+' | flags_of; }

# Renders a page as a reader sees it; prints groff's warnings on stderr.
render() {
  if command -v man >/dev/null; then
    LC_ALL=C MANWIDTH=80 MAN_KEEP_FORMATTING= man --warnings=w -l "$1"
  elif command -v groff >/dev/null; then
    LC_ALL=C groff -man -Tascii -P-cbou -ww "$1"
  elif command -v mandoc >/dev/null; then
    mandoc -Tlint -Wwarning "$1" >&2 || true
    mandoc -Tascii "$1"
  else
    fail "none of man, groff, mandoc: cannot render the pages"
  fi
}

version=$("$pgmutex" --version)
pages=(pgmutex)
for sub in $subcommands; do pages+=("pgmutex-$sub"); done
for page in "${pages[@]}"; do
  file="$man1/$page.1"
  [ -f "$file" ] || fail "$file not installed"
  if ! text=$(render "$file" 2>"$errors"); then fail "$page(1) does not render: $(cat "$errors")"; fi
  [ ! -s "$errors" ] || fail "$page(1) renders with warnings: $(cat "$errors")"
  # Strip overstrike (bold/underline) in case the renderer kept it.
  text=$(printf '%s\n' "$text" | sed -e 's/.\x08//g')
  grep -qF -- "$version" <<<"$text" || fail "$page(1) does not carry '$version' (pgmutex --version)"
  help_args=(--help)
  [ "$page" = pgmutex ] || help_args=("${page#pgmutex-}" --help)
  help=$("$pgmutex" "${help_args[@]}")
  for flag in $(printf '%s\n' "$help" | flags_of); do
    grep -qF -- "$flag" <<<"$text" || fail "$page(1) does not name $flag, which '${help_args[*]}' names"
  done
  # Each flag --help lists as an option has its own entry (a line of its own
  # at the entries' indent, "-q, --quiet" or "--lock NAME").
  for flag in $(printf '%s\n' "$help" | option_flags); do
    grep -qE -- "^ {7}(-[A-Za-z], )?$flag( |\$)" <<<"$text" || fail "$page(1) has no entry for $flag"
  done
  echo "$page(1): installed, renders without warnings, is $version's, names every flag of 'pgmutex ${help_args[*]}'"
done

[ -f "$completion" ] || fail "$completion not installed"
# Completes words 1.. of "pgmutex WORDS..." with the cursor on the last one;
# prints the candidates, one a line.
complete_words() {
  bash --norc --noprofile -c '
    source "$1"; shift
    [ "$(complete -p pgmutex)" = "complete -o default -F _pgmutex pgmutex" ] || { echo "not registered: $(complete -p pgmutex)" >&2; exit 1; }
    COMP_WORDS=(pgmutex "$@"); COMP_CWORD=$#; COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    _pgmutex pgmutex "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    printf "%s\n" "${COMPREPLY[@]}"' completion "$completion" "$@"
}
# "r" is both run and release: bash lists the two; "ru" completes to run.
[ "$(complete_words ru)" = run ] || fail "'pgmutex ru<TAB>' gives '$(complete_words ru)', not 'run'"
[ "$(complete_words r | sort | tr '\n' ' ')" = "$(printf '%s\n' $subcommands | grep '^r' | sort | tr '\n' ' ')" ] ||
  fail "'pgmutex r<TAB>' gives '$(complete_words r | tr '\n' ' ')', not the subcommands starting with r"
[ "$(complete_words '' | sort)" = "$(printf '%s\n' $subcommands | sort)" ] ||
  fail "'pgmutex <TAB>' gives '$(complete_words '' | tr '\n' ' ')', not the subcommands --help lists"
for sub in $subcommands; do
  offered=$(complete_words "$sub" -)
  for flag in $("$pgmutex" "$sub" --help | option_flags); do
    grep -qxF -- "$flag" <<<"$offered" || fail "'pgmutex $sub -<TAB>' does not offer $flag"
  done
  echo "completion: 'pgmutex $sub -<TAB>' offers every flag of 'pgmutex $sub --help'"
done
[ "$(complete_words run --statement-mode '' | tr '\n' ' ')" = "auto prepared unnamed " ] ||
  fail "'pgmutex run --statement-mode <TAB>' gives '$(complete_words run --statement-mode '' | tr '\n' ' ')'"
[ "$(complete_words run --wait --ti)" = --timeout ] ||
  fail "'pgmutex run --wait --ti<TAB>' gives '$(complete_words run --wait --ti)': a flag taken for a flag with a value?"
complete_words run --lock x -- ech | grep -x echo >/dev/null ||  # -q would end the pipe early: SIGPIPE under pipefail
  fail "'pgmutex run --lock x -- ech<TAB>' does not offer echo"
echo "completion: 'pgmutex ru<TAB>' is run, 'r<TAB>' lists run and release; flag values and the command after -- complete"
