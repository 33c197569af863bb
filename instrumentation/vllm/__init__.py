"""tokenpath's vLLM hooks: a stat-logger plugin, a tiny test model and a local launcher.

Importing this package never imports vLLM: the plugin class lives in
``tokenpath.instrumentation.vllm.plugin`` (loaded by vLLM through the
``vllm.stat_logger_plugins`` entry point), and the launcher runs vLLM in its own
virtual environment (``scripts/vllm_env.sh``). See docs/vllm.md.
"""
