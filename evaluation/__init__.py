"""Evaluation: the one scorer (metrics = SFT filter = reward terms), the benchmark runner,
reports and plots.

Entry points: `evaluation.metrics.score_trajectory`, `evaluation.reward.reward`,
`evaluation.sft_filter.select_for_sft`, `evaluation.bench.run_bench_command` /
`run_benchmark`. Nothing here imports dagster; heavy modules (index, torch, matplotlib) load
only when a benchmark runs.
"""
