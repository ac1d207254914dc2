#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, -DSLUICE_FUZZ=ON) and runs each for N seconds.
#
#   tests/fuzz/run.sh [--build DIR] [--seconds N] [--jobs J] [target...]
#
# DIR defaults to build-fuzz, N to 30, J (build jobs) to nproc; targets default to every tests/fuzz/fuzz_*.c. Each run
# starts from the checked-in seeds (tests/fuzz/corpus/<target>/, read only) plus DIR/corpus/<target>/,
# where new interesting inputs accumulate across runs. A crash, leak, UBSan report or timeout
# stops that target; the reproducer lands in DIR/artifacts/ and the script exits 1 after running
# the others. To keep it: copy the file into tests/fuzz/regressions/<target>/, fix the bug, and
# ctest fuzz/replay/<target> replays it forever. Exit 77 (ctest: skipped) only when clang or
# libFuzzer is missing (deploy/install-deps.sh installs both).
set -uo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$SRC/build-fuzz"
SECONDS_EACH=30
JOBS="$(nproc 2>/dev/null || echo 2)"
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
if [ ${#TARGETS[@]} -eq 0 ]; then
  for f in "$SRC"/tests/fuzz/fuzz_*.c; do TARGETS+=("$(basename "$f" .c)"); done
fi

CLANG="$(command -v clang || command -v clang-14 || true)"
CLANGXX="$(command -v clang++ || command -v clang++-14 || true)"  # the RE2 shim is C++
if [ -z "$CLANG" ] || [ -z "$CLANGXX" ]; then
  echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev); skipping" >&2
  exit 77
fi
probe="$(mktemp -d)"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }' > "$probe/p.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
  rm -rf "$probe"
  echo "fuzz: $CLANG cannot link libFuzzer (apt-get install libclang-rt-14-dev); skipping" >&2
  exit 77
fi
rm -rf "$probe"

echo "fuzz: building ${#TARGETS[@]} targets in $BUILD"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" \
  -DCMAKE_BUILD_TYPE=Debug -DSLUICE_FUZZ=ON -DSLUICE_SANITIZE=OFF -DSLUICE_TSAN=OFF >/dev/null || exit 1
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$BUILD/build.log" 2>&1 || {
  tail -40 "$BUILD/build.log"; exit 1; }

mkdir -p "$BUILD/artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
printf '%-22s %8s %10s %8s %s\n' target seconds execs corpus result
for t in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$t"
  mkdir -p "$work"
  log="$BUILD/artifacts/$t.log"
  # -timeout: one input taking 10 s is a hang worth a report (a slow regex, a quadratic loop).
  "$BUILD/tests/fuzz/$t" "$work" "$SRC/tests/fuzz/corpus/$t" \
    -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$BUILD/artifacts/$t-" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  result=ok
  if [ $rc -ne 0 ]; then
    result="FAILED (rc $rc): $(grep -m1 -E 'ERROR:|runtime error|FUZZ_CHECK|Test unit written' "$log")"
    failed+=("$t")
  fi
  printf '%-22s %8s %10s %8s %s\n' "$t" "$SECONDS_EACH" "${execs:-?}" "$(ls "$work" | wc -l)" "$result"
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failures in ${failed[*]}; logs and reproducers in $BUILD/artifacts/" >&2
  for t in "${failed[@]}"; do
    echo "---- $t ----" >&2
    grep -E -A25 'ERROR:|runtime error|FUZZ_CHECK' "$BUILD/artifacts/$t.log" | head -60 >&2
  done
  exit 1
fi
