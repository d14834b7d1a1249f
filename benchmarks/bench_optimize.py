"""optimize vs build on the GPU: (a) a replayed LLM body accepted or discarded; (b) the dev set and
the precision-sensitive models under tf32 with no LLM. Resumable: finished problems are kept in
``OUT/results.jsonl`` and skipped on a rerun; each problem has its own wall budget.

    python benchmarks/bench_optimize.py replay --out $OUT/replay
    python benchmarks/bench_optimize.py suite --budget 60 --out $OUT/suite [--only 1_40] [--limit N]

``suite`` compares, per problem, the first candidate (exactly what ``build`` makes, judged by the
same Verifier settings) with the run's best: ms, verdict, the proposers whose candidates became
best, and wall seconds; the best is verified once more with the torch.compile baselines. It writes
``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = ["models/gemm_row_sum.py", "models/relu_attention.py", "models/mlp_sum_head.py"]


def problems(only: list[str], limit: int | None) -> list[tuple[str, str]]:
    dev = Path(os.environ.get("STITCHCUDA_KERNELBENCH") or REPO.parent / "shared" / "kernelbench" / "dev.jsonl")
    out = [(Path(m).stem, str(REPO / m)) for m in MODELS]
    if dev.is_file():
        for line in dev.read_text().splitlines():
            d = json.loads(line)
            out.append((f"{d['level']}_{d['problem_id']}", f"kernelbench:{d['level']}:{d['problem_id']}"))
    if only:
        out = [p for p in out if any(o in p[0] for o in only)]
    return out[:limit] if limit else out


def suite(args) -> None:
    from stitchcuda.workflow import optimize
    from stitchcuda.workflow.report import proposer_wins

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res_file = out / "results.jsonl"
    done = {json.loads(ln)["id"] for ln in res_file.read_text().splitlines() if ln.strip()} if res_file.is_file() else set()
    for pid, ref in problems(args.only or [], args.limit):
        if pid in done:
            continue
        t0 = time.monotonic()
        rec = {"id": pid, "reference": ref}
        try:
            run = out / "runs" / pid
            r = optimize(ref, precision=args.precision, budget=args.budget, out=run, resume=(run / "run.json").is_file(),
                         progress=lambda s: print(f"[{pid}] {s}", flush=True))
            st = r.state
            root, best = st.root_candidate, st.best_candidate
            rec.update(build_verdict=root.judgement.kind if root and root.judgement else None,
                       build_ms=root.ms if root else None, best_ms=best.ms if best else None,
                       best_verdict=best.judgement.kind if best else None, best_id=best.id if best else None,
                       wins=proposer_wins(st), candidates=len(st.candidates), finished=st.finished,
                       final=st.final.summary if st.final else None, final_ms=st.final.ms if st.final else None,
                       compile_policy_ms=dict(st.final.baselines).get("compile_policy") if st.final else None)
        except Exception as e:  # noqa: BLE001 - one problem's failure is a row of the table
            rec.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        with res_file.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)
    rows = [json.loads(ln) for ln in res_file.read_text().splitlines() if ln.strip()]
    lines = [f"optimize vs build, {args.precision}, budget {args.budget} per problem", "",
             "| problem | build ms | build verdict | optimize ms | verdict | x build | x torch.compile | won by | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(x):
            return "-" if x is None else f"{x:.4g}"
        xb = f"{r['build_ms'] / r['best_ms']:.2f}" if r.get("build_ms") and r.get("best_ms") else "-"
        xc = f"{r['compile_policy_ms'] / r['final_ms']:.2f}" if r.get("compile_policy_ms") and r.get("final_ms") else "-"
        lines.append(f"| {r['id']} | {f(r.get('build_ms'))} | {r.get('build_verdict') or r.get('error', '-')} | "
                     f"{f(r.get('best_ms'))} | {r.get('final') or r.get('best_verdict') or '-'} | {xb} | {xc} | "
                     f"{', '.join(r.get('wins') or []) or '-'} | {r['wall_s']} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


BODY = """\
// A hand-written body for {fn}: the row sum of a contiguous matrix, one warp per row.
constexpr int {fn}_COLS4 = {cols} / 4;
static_assert({cols} % 256 == 0, "the unrolled loops assume whole warps of float4 pairs");
__global__ void {fn}_rows(const float* __restrict__ x, float* __restrict__ out, int rows) {{
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float4* r4 = reinterpret_cast<const float4*>(x + (long long)row * {cols});
  float s = 0.f;
{loop}
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) out[row] = s{wrong};
}}
{signature} {{
  {fn}_rows<<<({rows} + 7) / 8, 256, 0, stream>>>({x}, {out}, {rows});
  return cudaGetLastError() == cudaSuccess ? ST_OK : ST_ERR_CUDA;
}}
"""

#: Coalesced: lane l reads float4 l, l+32, ...; the trip count a constant, unrolled, so many
#: loads are in flight per warp (the template's loop keeps fewer).
LOOP_FAST = """\
  float a = 0.f, b = 0.f;
#pragma unroll 16
  for (int c = lane; c < {fn}_COLS4; c += 64) {{
    float4 v = __ldcs(r4 + c), w = __ldcs(r4 + c + 32);
    a += (v.x + v.y) + (v.z + v.w);
    b += (w.x + w.y) + (w.z + w.w);
  }}
  s = a + b;"""

#: Right but slow: each lane sums its own contiguous slice (uncoalesced: a warp's loads hit 32 rows
#: of cache lines at once).
LOOP_SLOW = """\
  const int per = {fn}_COLS4 / 32;
  for (int c = lane * per; c < (lane + 1) * per; ++c) {{ float4 v = r4[c]; s += (v.x + v.y) + (v.z + v.w); }}"""


def replay(args) -> None:
    """A reference whose hot task is a plain row sum; three stored LLM replies for it: correct,
    wrong (off by a constant) and correct-but-slow (a serial loop): accepted, discarded, discarded."""

    from stitchcuda.code import contract
    from stitchcuda.llm import LLM, ModelIdentity, ResponseCache, code_prompt
    from stitchcuda.workflow import optimize
    from stitchcuda.workflow.llm import LLMProposer, subgraph_text
    from stitchcuda.pipeline import capture_problem

    ref = str(REPO / "benchmarks" / "row_sum_ref.py")
    out = Path(args.out)
    results = {}
    for label, wrong, slow in (("correct", "", False), ("wrong", " + 1.0f", False), ("slow", "", True)):
        problem = capture_problem(ref, precision="fp32")
        plan = problem.plan({})
        task = [t for t in plan.tasks if t.phase == "run"][-1]
        c = contract(plan, task)
        x, o = c.params[0], [p for p in c.params if p.role == "out"][0]
        rows, cols = x.shape[0], x.shape[-1]
        loop = (LOOP_SLOW if slow else LOOP_FAST).format(fn=c.function)
        body = BODY.format(fn=c.function, signature=c.signature, x=x.name, out=o.name, rows=rows, cols=cols,
                           wrong=wrong, loop=loop)
        cache_dir = out / label / "llm"
        ident = ModelIdentity("replayed-hand-written", 0, "0" * 64)
        cache = ResponseCache(cache_dir)
        prompt = code_prompt(c.function, c.describe(), subgraph_text(problem.graph, c.covers), attempts=())
        from stitchcuda.llm import Sampling

        cache.insert(ident, prompt, f"```cuda\n{body}```\n", sampling=Sampling(max_tokens=1024))
        client = LLM.replay(cache_dir, identity=ident)
        r = optimize(ref, precision="fp32", budget=args.budget, out=out / label / "run", llm=None,
                     proposers=[LLMProposer(client, max_tokens=1024, max_bodies=1, max_decisions=0)],
                     progress=lambda s: print(f"[{label}] {s}", flush=True), final_verify=False)
        st = r.state
        llm = [cd for cd in st.candidates if cd.proposer == "llm"]
        results[label] = {"llm_candidates": [(cd.id, cd.judgement.kind, cd.ms, cd.judgement.summary) for cd in llm],
                          "template_ms": st.root_candidate.ms, "best": st.best, "best_proposer": st.best_candidate.proposer
                          if st.best_candidate else None, "calls": client.usage()}
        print(json.dumps(results[label]), flush=True)
    (out / "replay.json").write_text(json.dumps(results, indent=1))
    # The rule: a body replaces the template only when it verifies and is faster by the margin.
    ok = results["wrong"]["best_proposer"] == "template" and results["slow"]["best_proposer"] == "template"
    c = results["correct"]
    passed = [x for x in c["llm_candidates"] if x[1] == "passed"]
    faster = bool(passed) and passed[0][2] < c["template_ms"] * 0.98
    ok = ok and bool(passed) and (c["best_proposer"] == "llm") == faster
    print("REPLAY", "as expected" if ok else "NOT as expected",
          f"(correct body {'faster: accepted' if faster else 'not faster: discarded'})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("suite")
    a.add_argument("--budget", default="60s")
    a.add_argument("--precision", default="tf32")
    a.add_argument("--out", required=True)
    a.add_argument("--only", action="append")
    a.add_argument("--limit", type=int)
    b = sub.add_parser("replay")
    b.add_argument("--budget", default="90s")
    b.add_argument("--out", required=True)
    args = ap.parse_args()
    (suite if args.cmd == "suite" else replay)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
