# decode / verify at B = 16 (the decode's 16 rows now on the GEMV), then the end-to-end engine run
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
timeout 100 python3 bench/model_verify.py --B 16 --L 1024 --N 64 --gdn-precisions tf32 --out $OUT/mv_B16.json 2>&1 | grep -E "^ +16 +1024|Error|error"
timeout 300 python3 bench/e2e.py --linear auto --batches 1 64 --acceptance 0.6 0.8 --sweep 16 32 64 --no-draft-model --new-tokens 256 --time-limit 230 --out $OUT/e2e.json --markdown $OUT/e2e.md --plot $OUT/e2e.png 2>&1 | tail -45
