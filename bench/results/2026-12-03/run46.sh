# Twenty-second session, run 46: the dtype rule (the fused kernel's descriptors for fp32 inputs, and past N = 64 for
# 16-bit ones) as the model launches the verify (run 43's model-like probe), the A / B harness (bench/ab_verify.py),
# then the GPU tests of the kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run46.txt
timeout 200 python3 bench/gdn_profile.py --model-like --model-like-nodes 8 16 32 128 \
  --model-like-variants default default_pointers --budget-s 150 --out $OUT/model_like_run46.json >> $LOG 2>&1
echo "rc $?" >> $LOG
timeout 60 python3 -c "
import torch
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G
d = torch.device('cuda')
v, c = G.verify_config(1, 32, 8, 128, 128, d, 16), G.commit_config(1, 32, 8, 128, 128, d)
time_variants(1, 8, 'tf32', {'fp32 default': (v, c), 'pointers': (v._replace(tma=False), c)}, rounds=3)
" >> $LOG 2>&1
echo "harness rc $?" >> $LOG
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_optimized_model.py \
  tests/test_engine_optimized.py tests/test_demo_gpu_path.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "model_like|rc |passed|failed|Error|^\\| " $LOG
