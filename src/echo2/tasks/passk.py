"""pass@k: the chance that at least one of k completions drawn from n samples (c of them
correct) is correct, by the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k),
in a product form that stays exact for large n."""

from __future__ import annotations


def pass_at_k(n: int, correct: int, k: int) -> float:
    if not 0 <= correct <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= correct <= n and 1 <= k <= n (got n={n}, correct={correct}, k={k})")
    if n - correct < k:
        return 1.0
    miss = 1.0
    for i in range(n - correct + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(correct_counts: list[int], n: int, k: int) -> float:
    return sum(pass_at_k(n, c, k) for c in correct_counts) / max(1, len(correct_counts))
