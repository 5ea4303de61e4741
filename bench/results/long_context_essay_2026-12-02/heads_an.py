import sys, torch
data = torch.load(sys.argv[1])
for it in data:
    S = it["scores"]  # (24, heads, n)
    keys = it["keys"]
    c = S[:, :, 1:-8]; c = c / c.sum(-1, keepdim=True)
    n = c.shape[-1]; k = max(1, int(0.01 * n))
    top = c.topk(k, dim=-1).values.sum(-1)  # (24, heads) top-1% mass of content
    H = -(c.clamp_min(1e-12).log() * c).sum(-1)
    needle = (S[:, :, keys].sum(-1) / S[:, :, 1:-8].sum(-1)).max(-1).values
    print(it["task"], it["index"], len(keys))
    print("  max-head top1% ", " ".join(f"{x:.2f}" for x in top.max(-1).values.tolist()))
    print("  min-head H     ", " ".join(f"{x:.1f}" for x in H.min(-1).values.tolist()))
    print("  max-head needle", " ".join(f"{x:.2f}" for x in needle.tolist()))
