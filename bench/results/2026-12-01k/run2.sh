# eleventh session, run 2 (written, not run: no device time this session). For after run1.sh, on the warm machine:
# the cold tree-attention probe on the final code (issue 6's B = 1 target, 1.3x one SDPA decode over 8k keys) and
# the end-to-end bench, last run in the seventh session (issue 7's numbers on the decode and verify paths since).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run2.txt
timeout 100 python3 bench/attention_probe.py --cold --budget-s 80 --out $OUT/attention_probe_cold.json \
  > /tmp/probe.log 2>&1
cat /tmp/probe.log >> $LOG; grep -E "^B=|default" /tmp/probe.log | head -12
timeout 300 python3 bench/e2e.py --linear auto --batches 1 64 --acceptance 0.6 0.8 --sweep 16 32 64 \
  --no-draft-model --new-tokens 256 --time-limit 230 --out $OUT/e2e.json --markdown $OUT/e2e.md \
  --plot $OUT/e2e.png > /tmp/e2e.log 2>&1
cat /tmp/e2e.log >> $LOG; tail -45 /tmp/e2e.log
