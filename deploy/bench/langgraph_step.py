"""The LangGraph side of the durable-step bench
(crates/worker/benches/durable_step.rs): the same ReAct loop as the engine's
side, in LangGraph with its SQLite checkpointer on a file.

A StateGraph over MessagesState: a model node that asks a fake chat model
(langchain-core's GenericFakeChatModel, no network) for its next scripted
AIMessage (one call of the no-op tool per step, then a final answer), a
ToolNode with the no-op tool, and tools_condition between them. The graph
is compiled with SqliteSaver on a file in a temporary directory (the
durable setting; SqliteSaver puts the database in WAL mode, and SQLite's
`synchronous` setting is printed with the versions).

A step is timed from one model call to the next: the checkpoint after the
previous step's tools, the model node, its checkpoint, the tool node. The
bytes of a step are the checkpoint, metadata and pending-write blobs SQLite
stored for its two super-steps (model, tools); the input's and the final
answer's count with the first and the last step, as on the engine side.

Prints one JSON line with the versions, then one per run:
{"steps", "latencies_us", "bytes", "file_bytes"}. Run it in the venv of
langgraph_setup.sh: `.venv/bin/python langgraph_step.py --steps 10,100`.
"""

import argparse
import json
import os
import platform
import sqlite3
import tempfile
import time
from importlib.metadata import version

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def noop(step: int) -> str:
    """Does nothing."""
    return "ok"


def scripted(steps):
    """One call of the no-op tool per step, then a final answer."""
    for step in range(1, steps + 1):
        yield AIMessage(
            content="",
            tool_calls=[{"name": "noop", "args": {"step": step}, "id": f"call-{step}"}],
        )
    yield AIMessage(content="done")


def run(steps, directory, label="bench"):
    """`steps` steps with SqliteSaver on a fresh file; the figures."""
    path = os.path.join(directory, f"{label}-{steps}.sqlite")
    model = GenericFakeChatModel(messages=scripted(steps))
    calls = []

    def agent(state: MessagesState):
        calls.append(time.perf_counter())
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([noop]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    with SqliteSaver.from_conn_string(path) as saver:
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": f"bench-{steps}"}, "recursion_limit": 2 * steps + 10}
        result = app.invoke({"messages": [HumanMessage(content="Run the tool.")]}, config)
        assert result["messages"][-1].content == "done"
        synchronous = saver.conn.execute("PRAGMA synchronous").fetchone()[0]
        journal = saver.conn.execute("PRAGMA journal_mode").fetchone()[0]
    latencies = [(b - a) * 1e6 for a, b in zip(calls, calls[1:])]
    assert len(latencies) == steps, (len(latencies), steps)
    files = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    return {
        "steps": steps,
        "latencies_us": latencies,
        "bytes": bytes_by_step(path, steps),
        "file_bytes": files,
    }, (synchronous, journal)


def bytes_by_step(path, steps):
    """Blob bytes SQLite stored, by ReAct step: super-steps 2k-1 (model)
    and 2k (tools) are step k; the input's (-1, 0) count with step 1 and
    the final answer's (2 steps + 1) with the last."""
    conn = sqlite3.connect(path)
    per_checkpoint = {}
    for checkpoint_id, size, metadata in conn.execute(
        "SELECT checkpoint_id, length(checkpoint) + length(metadata), metadata FROM checkpoints"
    ):
        per_checkpoint[checkpoint_id] = [json.loads(metadata)["step"], size]
    for checkpoint_id, size in conn.execute(
        "SELECT checkpoint_id, length(value) FROM writes"
    ):
        per_checkpoint[checkpoint_id][1] += size or 0
    conn.close()
    result = [0] * steps
    for super_step, size in per_checkpoint.values():
        step = min(max((super_step + 1) // 2, 1), steps)
        result[step - 1] += size
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="10,100,200,1000")
    args = parser.parse_args()
    counts = [int(s) for s in args.steps.split(",") if s]
    with tempfile.TemporaryDirectory() as directory:
        run(10, directory, "warm-up")
        runs = []
        for steps in counts:
            figures, (synchronous, journal) = run(steps, directory)
            runs.append(figures)
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    print(json.dumps({"versions": {
        "Python": platform.python_version(),
        "langgraph": version("langgraph"),
        "langgraph-checkpoint-sqlite": version("langgraph-checkpoint-sqlite"),
        "langchain-core": version("langchain-core"),
        "SQLite": f"{sqlite3.sqlite_version} ({journal}, synchronous={names.get(synchronous, synchronous)})",
    }}))
    for figures in runs:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
