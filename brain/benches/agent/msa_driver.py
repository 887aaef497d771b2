"""Runs mini-swe-agent once on a task repository, for the agent benchmark (brain/benches/agent.rs).

    python msa_driver.py REPO TASK_TEXT --steps N --wall SECONDS --api-base URL --model NAME
                         --max-tokens N --traj FILE

Its own text-based configuration (mini_textbased.yaml, the one mini-swe-agent ships for models
without native tool calls), the non-interactive DefaultAgent, the local environment in REPO.
Prints one line `MSA_RESULT {json}` last: exit_status, submitted, model calls, tokens, wall.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
# litellm fetches a price list from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import yaml  # noqa: E402  (a dependency of mini-swe-agent)

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import builtin_config_dir  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("repo")
    p.add_argument("task")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--wall", type=int, required=True)
    p.add_argument("--api-base", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--traj", default="")
    a = p.parse_args()

    cfg = yaml.safe_load((builtin_config_dir / "mini_textbased.yaml").read_text())
    agent_cfg = dict(cfg["agent"])
    agent_cfg.pop("mode", None)
    agent_cfg.update(
        step_limit=a.steps,
        cost_limit=0,
        wall_time_limit_seconds=a.wall,
        output_path=a.traj or None,
    )
    model_cfg = dict(cfg["model"])
    model_cfg["model_name"] = a.model
    model_cfg["cost_tracking"] = "ignore_errors"
    model_cfg["model_kwargs"] = dict(model_cfg.get("model_kwargs") or {}) | {
        "api_base": a.api_base,
        "api_key": "sk-no-key-needed",
        "max_tokens": a.max_tokens,
        "timeout": 600,
    }
    env_cfg = dict(cfg.get("environment") or {})
    env_cfg["cwd"] = a.repo

    model = LitellmTextbasedModel(**model_cfg)
    env = LocalEnvironment(**env_cfg)
    agent = DefaultAgent(model, env, **agent_cfg)
    t0 = time.time()
    error = ""
    try:
        result = agent.run(a.task)
    except Exception as e:  # the agent records it as its exit message and re-raises
        result = agent.messages[-1].get("extra", {}) if agent.messages else {}
        error = f"{type(e).__name__}: {e}"
    wall = time.time() - t0

    tokens = 0
    for m in agent.messages:
        resp = (m.get("extra") or {}).get("response")
        if isinstance(resp, dict):
            usage = resp.get("usage") or {}
            tokens += int(usage.get("total_tokens") or 0)
    status = result.get("exit_status", "") if isinstance(result, dict) else ""
    out = {
        "exit_status": status or ("error" if error else ""),
        "submitted": status == "Submitted",
        "model_calls": agent.n_calls,
        "tokens": tokens,
        "wall_s": wall,
        "error": error,
    }
    sys.stdout.flush()
    print("MSA_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
