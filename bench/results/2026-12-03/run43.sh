# Twenty-second session, run 43: the descriptor defaults as the model launches the verify at B = 1 (bf16, strided
# views of the conv output, 48 layers' cold states; bench/gdn_profile.py --model-like) against the same configs
# without descriptors
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run43.txt
nvidia-smi --query-gpu=name --format=csv >> $LOG
for round in 1 2; do
  timeout 250 python3 bench/gdn_profile.py --model-like --model-like-nodes 8 16 32 64 128 \
    --model-like-variants default default_pointers --budget-s 200 --out $OUT/model_like_run43_$round.json >> $LOG 2>&1
  echo "rc $?" >> $LOG
done
grep -E "model_like|rc |Error" $LOG
