# Twenty-second session, run 44: run 43's model-like launches with every launch on layer 0's data as well (state
# hot in L2), to tell the cold states from the bf16 strided inputs
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run44.txt
for round in 1 2; do
  timeout 250 python3 bench/gdn_profile.py --model-like --model-like-nodes 8 16 64 128 \
    --model-like-variants default default_pointers default_hot default_pointers_hot --budget-s 200 \
    --out $OUT/model_like_run44_$round.json >> $LOG 2>&1
  echo "rc $?" >> $LOG
done
grep -E "model_like|rc |Error" $LOG
