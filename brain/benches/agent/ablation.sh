#!/usr/bin/env bash
# The ablation of the agent loop's assists: the agent bench's `tether` row, one attempt, once
# per variant, each a `brain run --assists` value. Prints one line per variant (solved, false
# success, calls, tokens) and keeps each run's whole output under target/agent-bench/.
#
#   bash brain/benches/agent/ablation.sh                 # all on ×2, native, each family off
#   bash brain/benches/agent/ablation.sh small native    # these variants only
#
# Needs the model server the bench uses (../shared/llm); AGENT_BENCH_* settings pass through.
set -euo pipefail
cd "$(dirname "$0")/../../.."
families="edits nudges history code_in_view check_driven restart loop_notes finish"
if [ $# -eq 0 ]; then
  set -- small small native
  for f in $families; do set -- "$@" "small,-$f"; done
fi
out="target/agent-bench/ablation-$(date +%s)"
mkdir -p "$out"
cargo bench -p brain --bench agent --no-run >/dev/null 2>&1
printf '%-22s %s\n' "assists" "harness          attempts    solved  claimed false success  med calls  med tokens     med wall"
for v in "$@"; do
  log="$out/$(echo "$v" | tr ',' '_').$(date +%s).txt"
  AGENT_BENCH_HARNESSES=tether AGENT_BENCH_ASSISTS="$v" AGENT_BENCH_OUT="$out/runs" \
    cargo bench -p brain --bench agent >"$log" 2>&1 || true
  line=$(grep -E '^tether +[0-9]' "$log" | tail -1 || true)
  printf '%-22s %s\n' "$v" "${line:-no result: see $log}"
done
echo "each run's output: $out"
