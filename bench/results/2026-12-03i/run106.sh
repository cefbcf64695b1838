# Run 106: the vector partition's register budget (48: the consumer 136 with 4 spill stores; 40: the consumer 144,
# its own loop unrolled or not) at SOLVER_REGS 184 (kernel_ab.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run106.txt
timeout 300 python3 bench/results/2026-12-03i/kernel_ab.py $OUT/kernel_ab_run106.json "library 184,vec40 184,\
rt40 184,library 184,vec40 184,rt40 184,vec40 176,rt40 176,vec40 192" >> $LOG 2>&1
echo "kernel_ab rc $?" >> $LOG
grep -E 'verify |rc |Error' $LOG | tail -20
