"""Which kernels torch and the runtime launch for the same GEMMs (diagnostic)."""
import torch
from torch.profiler import ProfilerActivity, profile

from stitchcuda import rt

s = torch.cuda.current_stream().cuda_stream
cases = [("bf16 4096 x w.T", torch.bfloat16, "bf16", 4096, 4096, 4096, False),
         ("bf16 2048x4096x4096 bias+gelu", torch.bfloat16, "bf16", 2048, 4096, 4096, True)]
for name, dt, pol, m, n, k, epi in cases:
    x = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt)
    o = torch.empty(m, n, device="cuda", dtype=dt)
    if epi:
        t_fn = lambda: torch.nn.functional.gelu(torch.addmm(b, x, w.t()), approximate="tanh")
        o_fn = lambda: rt.gemm(x, w, o, policy=pol, trans_b=True, epilogue="bias_gelu", bias=b, stream=s)
        b_fn = lambda: rt.gemm(x, w, o, policy=pol, trans_b=True, epilogue="bias", bias=b, stream=s)
    else:
        t_fn = lambda: torch.matmul(x, w.t())
        o_fn = lambda: rt.gemm(x, w, o, policy=pol, trans_b=True, stream=s)
        b_fn = o_fn
    for label, fn in [("torch", t_fn), ("ours", o_fn), ("ours_bias_only", b_fn)]:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        evs = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                d = evs.setdefault(e.name, [0, 0.0])
                d[0] += 1
                d[1] += e.device_time
        print(f"{name} [{label}]")
        for k_, (cnt, us) in sorted(evs.items(), key=lambda kv: -kv[1][1]):
            print(f"    {us / cnt:8.1f} us x{cnt}  {k_[:150]}")
