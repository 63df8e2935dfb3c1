"""`vllm-vspec bench serve`: serving benchmark of dynamic gamma against fixed gamma.

Modules, one job each:
  variants   what is compared (target-only, fixed gamma, static table, online)
  workloads  steady and bursty request schedules over the bundled prompts
  server     one `vllm serve` subprocess per variant (free port, /health, kill)
  loadgen    async OpenAI-API clients that replay a workload
  scrape     Prometheus /metrics polling and the vspec decision trace
  report     tokens/s, ratios, exactness, gamma counts; table and results JSON
  plot       gamma and batch size over time (PNG)
  protocols  ARC-Easy / GSM8K style serving protocols against a running server
  command    the CLI subcommand that composes the above

The benchmark is not a test: it measures, it does not assert.
"""
