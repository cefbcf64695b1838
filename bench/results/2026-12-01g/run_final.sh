# final code: the whole GPU test suite, then a B = 1 end-to-end check (budget tree vs chain, fixed N = 64)
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py tests/test_tree_attention.py tests/test_gemv.py tests/test_optimized_model.py tests/test_gdn_decode.py tests/test_engine_optimized.py tests/test_demo_gpu_path.py 2>&1 | tail -4
cp gpu_*.json $OUT/ 2>/dev/null
timeout 140 python3 bench/e2e.py --linear auto --batches 1 --acceptance 0.8 --sweep 64 --no-draft-model --new-tokens 256 --time-limit 90 --out $OUT/e2e_b1.json --markdown $OUT/e2e_b1.md 2>&1 | tail -14
