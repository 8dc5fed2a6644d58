#!/usr/bin/env python3
"""Writes an overlay's workers.yaml from its fleet.toml: one worker
StatefulSet per board.

The fleet file is the one list of boards: the worker pods mount it (the
`mtswarm-fleet` ConfigMap) and `mtswarm credentials --fleet` makes each
board's NATS identity from it, so the StatefulSets are generated from it
too rather than kept equal to it by hand. Each board gets a StatefulSet
`mtswarm-worker-<board>` with one pod that serves that board
(MTSWARM_BOARD), sees only its own NATS key of the worker Secret, and, when
the board names a `host`, runs on that Kubernetes node (nodeSelector
kubernetes.io/hostname), where the board is attached. Everything else of
the pod is k8s/components/workers/worker-pod.yaml, patched into these
StatefulSets by kustomize.

Usage:
  python3 k8s/generate-workers.py            rewrite every overlay's workers.yaml
  python3 k8s/generate-workers.py --check    exit 1 if one is out of date
  python3 k8s/generate-workers.py DIR...     only these overlay directories

The tests (`cargo test -p mtswarm-tests --test k8s`) run --check
and compare the rendered StatefulSets with the fleet as the real fleet
parser reads it.
"""

import os
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    sys.exit("generate-workers: needs Python >= 3.11 (tomllib)")

K8S = os.path.dirname(os.path.abspath(__file__))
OVERLAYS = os.path.join(K8S, "overlays")
PREFIX = "mtswarm-worker-"
# A StatefulSet's name plus "-" and a 10-character revision hash is a label
# value (at most 63 characters).
MAX_NAME = 52
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Keys of the worker Secret every worker pod needs (the board's own NATS
# key and TLS certificate and key are added per board).
SHARED_KEYS = ["identities.toml", "decision.pub"]


class FleetError(Exception):
    """A fleet file that cannot be turned into worker StatefulSets."""


def boards_of(fleet_path):
    """The (id, backend, host) of every [[board]] of fleet_path, checked for
    what Kubernetes needs of them."""
    try:
        with open(fleet_path, "rb") as f:
            fleet = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise FleetError(f"{fleet_path}: {e}") from e
    boards = fleet.get("board", [])
    if not isinstance(boards, list) or not boards:
        raise FleetError(f"{fleet_path}: no [[board]]")
    seen = set()
    result = []
    for index, board in enumerate(boards):
        board_id = board.get("id") if isinstance(board, dict) else None
        if not isinstance(board_id, str):
            raise FleetError(f"{fleet_path}: board {index + 1} has no id")
        where = f"{fleet_path}: board {board_id!r}"
        if not DNS_LABEL.match(board_id):
            raise FleetError(
                f"{where}: its id names Kubernetes objects and pods, so it must be "
                "lowercase letters, digits and '-', starting and ending with a letter or digit"
            )
        if len(PREFIX) + len(board_id) > MAX_NAME:
            raise FleetError(
                f"{where}: id too long for a StatefulSet name "
                f"(at most {MAX_NAME - len(PREFIX)} characters)"
            )
        if board_id in seen:
            raise FleetError(f"{where}: listed twice")
        seen.add(board_id)
        host = board.get("host")
        if host is not None and (
            not isinstance(host, str) or len(host) > 63 or not LABEL_VALUE.match(host)
        ):
            raise FleetError(
                f"{where}: host {host!r} is not a Kubernetes node name "
                "(the kubernetes.io/hostname label value)"
            )
        result.append((board_id, str(board.get("backend", "")), host))
    return result


def statefulset(board_id, backend, host):
    """The worker StatefulSet of one board, as YAML text."""
    name = PREFIX + board_id
    labels = (
        "app.kubernetes.io/name: mtswarm-worker\n"
        f"app.kubernetes.io/instance: {name}\n"
    )

    def indent(text, spaces):
        pad = " " * spaces
        return "".join(pad + line + "\n" for line in text.splitlines())

    node = ""
    if host is not None:
        node = (
            "      # The board is attached to this node.\n"
            "      nodeSelector:\n"
            f'        kubernetes.io/hostname: "{host}"\n'
        )
    nkey = f"worker-{board_id}.nk"
    # Its own TLS certificate and key (issued for its identity only),
    # mounted under fixed names the shared pod template points at.
    own = [(key, key) for key in SHARED_KEYS + [nkey]] + [
        (f"worker-{board_id}.pem", "worker.pem"),
        (f"worker-{board_id}.key", "worker.key"),
    ]
    items = "".join(
        f"              - key: {key}\n                path: {path}\n" for key, path in own
    )
    where = f"on node {host}" if host is not None else "on any node"
    return (
        f"# Board {board_id} ({backend}), {where}.\n"
        "apiVersion: apps/v1\n"
        "kind: StatefulSet\n"
        "metadata:\n"
        f"  name: {name}\n"
        "  labels:\n"
        f"{indent(labels, 4)}"
        "spec:\n"
        "  replicas: 1\n"
        "  serviceName: mtswarm-worker\n"
        "  selector:\n"
        "    matchLabels:\n"
        f"{indent(labels, 6)}"
        "  template:\n"
        "    metadata:\n"
        "      labels:\n"
        f"{indent(labels, 8)}"
        "    spec:\n"
        f"{node}"
        "      containers:\n"
        "        - name: worker\n"
        "          env:\n"
        "            - name: MTSWARM_BOARD\n"
        f"              value: {board_id}\n"
        "            - name: MTSWARM_NATS_NKEY_FILE\n"
        f"              value: /etc/mtswarm/credentials/{nkey}\n"
        "      volumes:\n"
        "        - name: credentials\n"
        "          secret:\n"
        "            secretName: mtswarm-worker-credentials\n"
        "            defaultMode: 0400\n"
        "            items:\n"
        f"{items}"
    )


def render(overlay):
    fleet = os.path.join(overlay, "fleet.toml")
    header = (
        "# Generated by k8s/generate-workers.py from fleet.toml (next to this\n"
        "# file): one worker StatefulSet per board. Do not edit; change\n"
        "# fleet.toml and run `python3 k8s/generate-workers.py`.\n"
    )
    docs = [statefulset(*board) for board in boards_of(fleet)]
    return header + "---\n".join(docs)


def overlays_with_fleets():
    return [
        os.path.join(OVERLAYS, name)
        for name in sorted(os.listdir(OVERLAYS))
        if os.path.isfile(os.path.join(OVERLAYS, name, "fleet.toml"))
    ]


def main(argv):
    check = "--check" in argv
    dirs = [a for a in argv if a != "--check"] or overlays_with_fleets()
    stale = []
    for overlay in dirs:
        try:
            text = render(overlay)
        except FleetError as e:
            print(f"generate-workers: {e}", file=sys.stderr)
            return 2
        target = os.path.join(overlay, "workers.yaml")
        try:
            with open(target, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        if check:
            stale.append(target)
        else:
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"generate-workers: wrote {target}")
    if stale:
        for target in stale:
            print(
                f"generate-workers: {target} does not match its fleet.toml; "
                "run `python3 k8s/generate-workers.py`",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
