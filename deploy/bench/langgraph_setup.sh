#!/usr/bin/env bash
# Creates the venv the durable-step bench runs its LangGraph side in
# (deploy/bench/langgraph_step.py), with the pinned versions of
# deploy/bench/requirements.txt. The venv goes to $LANGGRAPH_VENV, by
# default deploy/bench/.venv (ignored by git), where the bench looks for it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${LANGGRAPH_VENV:-$here/.venv}"
python="${PYTHON:-python3}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
"$venv/bin/python" -m pip freeze | grep -iE '^(langgraph|langchain-core)' || true
echo "LangGraph venv ready: $venv"
