#!/usr/bin/env bash
# Time two builds of fp8quant on this GPU, alternating them in one session, for a change that
# must not make any kernel slower (a refactor's before and after):
#
#   scripts/compare_wheels.sh BEFORE.whl AFTER.whl
#
# Each round installs one wheel (--no-deps), runs the bench modes below and writes their
# Markdown tables to $LOGDIR (default build/compare) as <round>-<before|after>-<mode>.md; two
# rounds, before and after alternating, so that the machine's drift shows as round-to-round
# noise. Modes (BENCH_MODES, ';'-separated): the quantizer (--quick), --norm, --weights and
# --moe at decode and prefill sizes.
set -uo pipefail
before=${1:?usage: scripts/compare_wheels.sh BEFORE.whl AFTER.whl}
after=${2:?usage: scripts/compare_wheels.sh BEFORE.whl AFTER.whl}
out=${LOGDIR:-build/compare}
mkdir -p "$out"
IFS=';' read -r -a modes <<<"${BENCH_MODES:---quick;--norm --m 2048,4096;--weights --m 7168;--moe --m 16,128,4096}"
status=0
for round in 1 2; do
  for which in before after; do
    wheel=$before
    [ "$which" = after ] && wheel=$after
    python -m pip install -q --no-deps --no-index --force-reinstall "$wheel" || exit 1
    for mode in "${modes[@]}"; do
      name=$(echo "$mode" | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
      echo "==> round $round, $which: bench $mode"
      # shellcheck disable=SC2086
      python -m fp8quant bench $mode --markdown "$out/$round-$which-$name.md" | tail -n 12 || status=1
    done
  done
done
exit $status
