#!/usr/bin/env bash
# The ctest test cli_help: every command of the `rdmabuf` tool has a help of
# its own. For each command below, `rdmabuf COMMAND --help` and `-h` must
# exit 0 at once, print the same text, starting with that command's usage
# line, in lines of at most 80 columns, and name every option the command
# accepts. The lists below are checked against the option parsing itself:
# every name in a parse_args call of a command's source file must be in the
# list of a command of that file, and every file of the tool that parses
# options must be listed, so that an option added without its help fails
# here. Unknown options must still fail with exit status 2.
#
#   check_cli_help.sh RDMABUF_TOOL SOURCE_DIR
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 RDMABUF_TOOL SOURCE_DIR" >&2; exit 2; }
tool=$1 src=$2
limit=20  # seconds; a command without help would run, or wait, instead

# COMMAND WORDS | its source file under tools/ | the options it accepts
specs=(
  "info|cmd_info.cc|"
  "serve|cmd_serve.cc|size pattern gpu listen endpoint host-memory"
  "read|cmd_rw.cc|offset length"
  "write|cmd_rw.cc|offset"
  "bench|bench.cc|backend sizes batch streams iters window layouts connect peer host-memory json quiet op compare"
  "bench --op send|bench_send.cc|op backend sizes iters rounds window peer json"
  "bench --op notify|bench_send.cc|op backend sizes iters rounds window peer json"
  "bench --gpu|bench_gpu.cc|gpu device size tcp-size iters peer json"
  "bench --compare|bench_compare.cc|compare out sizes vm-sizes rounds iters seconds no-install no-vm"
  "soak|soak.cc|seconds backend clients managers inflight max-size buffers seed json role"
  "version|main.cc|"
)
# Files that parse options for no command a user runs: the definition of
# parse_args, and the processes `rdmabuf soak` starts (`--role`).
not_commands=(args.cc soak_roles.cc)

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Runs the tool with a time limit; stdout to $tmp/out, stderr to $tmp/err.
run() {
  local rc=0
  timeout "$limit" "$tool" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  echo "$rc"
}

# The option names in every parse_args call of a file, one a line.
parsed_options() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for call in re.finditer(r"\bparse_args\(", text):
    depth, i = 1, call.end()
    while depth and i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    for name in re.findall(r'"([^"]*)"', text[call.end():i]):
        print(name)
PY
}

# Every file of the tool that parses options belongs to a command here.
for path in "$src"/tools/*.cc; do
  file=$(basename "$path")
  grep -q '\bparse_args(' "$path" || continue
  covered=0
  for spec in "${specs[@]}"; do
    IFS='|' read -r _ f _ <<<"$spec"
    [ "$f" = "$file" ] && covered=1
  done
  for f in "${not_commands[@]}"; do
    [ "$f" = "$file" ] && covered=1
  done
  [ $covered -eq 1 ] || fail "tools/$file parses options but no command here is checked for them"
done

# Every option a file parses is in the list of one of its commands.
for spec in "${specs[@]}"; do
  IFS='|' read -r _ file _ <<<"$spec"
  listed=" "
  for other in "${specs[@]}"; do
    IFS='|' read -r _ f options <<<"$other"
    [ "$f" = "$file" ] && listed+="$options "
  done
  while read -r name; do
    [ -n "$name" ] || continue
    [[ "$listed" == *" $name "* ]] ||
      fail "tools/$file accepts --$name, which this test does not expect: add it to the command's --help and to the list here"
  done < <(parsed_options "$src/tools/$file")
done

for spec in "${specs[@]}"; do
  IFS='|' read -r command file options <<<"$spec"
  read -ra words <<<"$command"
  rc=$(run "${words[@]}" --help)
  cp "$tmp/out" "$tmp/long"
  if [ "$rc" != 0 ]; then
    fail "rdmabuf $command --help exited $rc: $(head -c 300 "$tmp/err")"
    continue
  fi
  [ -s "$tmp/err" ] && fail "rdmabuf $command --help wrote to stderr: $(head -c 300 "$tmp/err")"
  head -n 1 "$tmp/long" | grep -q "^usage: rdmabuf ${words[0]}\b" ||
    fail "rdmabuf $command --help does not start with its usage line: $(head -n 1 "$tmp/long")"
  if [ "${#words[@]}" -gt 1 ]; then
    head -n 1 "$tmp/long" | grep -qF -- "${words[1]}" ||
      fail "rdmabuf $command --help gives the usage of another form: $(head -n 1 "$tmp/long")"
  fi
  for name in $options help; do
    grep -qE -- "--$name([^a-z0-9-]|\$)" "$tmp/long" ||
      fail "rdmabuf $command --help does not mention --$name"
  done
  awk -v c="$command" 'length > 80 { print "FAIL: rdmabuf " c " --help: a line of " length \
    " columns: " $0; bad = 1 } END { exit bad }' "$tmp/long" >&2 || failures=$((failures + 1))

  rc=$(run "${words[@]}" -h)
  { [ "$rc" = 0 ] && cmp -s "$tmp/out" "$tmp/long"; } ||
    fail "rdmabuf $command -h (exit $rc) does not print what --help prints"
  rc=$(run help "${words[@]}")
  { [ "$rc" = 0 ] && cmp -s "$tmp/out" "$tmp/long"; } ||
    fail "rdmabuf help $command (exit $rc) does not print what --help prints"

  if [ "$command" != version ]; then
    rc=$(run "${words[@]}" --no-such-option)
    [ "$rc" = 2 ] || fail "rdmabuf $command --no-such-option exited $rc, not 2"
    grep -q "unknown option --no-such-option" "$tmp/err" ||
      fail "rdmabuf $command --no-such-option did not say why: $(head -c 300 "$tmp/err")"
  fi
done

# The help wins over options that would be refused.
rc=$(run bench --sizes 0 --help)
[ "$rc" = 0 ] || fail "rdmabuf bench --sizes 0 --help exited $rc, not 0"
rc=$(run bench --op --help)
{ [ "$rc" = 0 ] && grep -q "^usage: rdmabuf bench --op" "$tmp/out"; } ||
  fail "rdmabuf bench --op --help (exit $rc) does not print the help of --op"

# The overview names every command and where their details are.
rc=$(run --help)
[ "$rc" = 0 ] || fail "rdmabuf --help exited $rc"
grep -q "rdmabuf COMMAND --help" "$tmp/out" || fail "rdmabuf --help does not point to COMMAND --help"
for spec in "${specs[@]}"; do
  IFS='|' read -r command _ _ <<<"$spec"
  grep -qF -- "  $command " "$tmp/out" || fail "rdmabuf --help does not list $command"
done
rc=$(run)
[ "$rc" = 2 ] || fail "rdmabuf without a command exited $rc, not 2"
rc=$(run no-such-command --help)
[ "$rc" = 2 ] || fail "rdmabuf no-such-command --help exited $rc, not 2"

if [ $failures -gt 0 ]; then
  echo "cli help: $failures failure(s)" >&2
  exit 1
fi
echo "cli help: ok, ${#specs[@]} commands"
