"""Serves a GGUF model on loopback with llama.cpp's HTTP server, as embedded
in PyPI's xllamacpp, for `mtswarm llm serve` (which runs this script with
python3 and reads its first stdout line).

The chat template is the model's own (from the GGUF, rendered with Jinja, as
llama.cpp's `--jinja` does, which its tool calling needs); nothing patches
it. Prints one JSON line, `{"url": "http://127.0.0.1:PORT"}` once the model
is loaded and the server listens, or `{"error": "..."}`, then serves until
its standard input closes (the parent's way of stopping it, which also
stops it when the parent dies).
"""

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=8192, help="context tokens per slot")
    parser.add_argument("--parallel", type=int, default=2, help="slots (concurrent requests)")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--temperature", type=float, default=0.2)
    parser.add_argument("--verbosity", type=int, default=1)
    args = parser.parse_args()
    try:
        import xllamacpp as xlc
    except ImportError as error:
        print(json.dumps({"error": f"cannot import xllamacpp ({error}): "
                          "install it with deploy/local_model.sh"}), flush=True)
        return 3

    params = xlc.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    # One slot per concurrent caller (a leader and its workers), each with
    # its own context and prompt cache, so one loop's turn does not evict
    # the other's prefix.
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx * args.parallel
    params.kv_unified = False
    params.n_predict = args.max_tokens
    # The sampling temperature of requests that set none (mtswarm's set
    # none unless a job asks): low, so tool calls keep their shape.
    params.sampling.temp = args.temperature
    params.use_jinja = True
    params.ui = False
    params.endpoint_metrics = True
    params.verbosity = args.verbosity
    try:
        server = xlc.Server(params)
    except Exception as error:  # the server's own log (stderr) says why
        print(json.dumps({"error": str(error)}), flush=True)
        return 1
    print(json.dumps({"url": server.listening_address}), flush=True)
    sys.stdin.read()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
