"""Benchmark: tunekit's readers on an experiment on S3, by the requests each makes.

A local experiment (``EXP``, e.g. one ``many_trials.py --keep DIR`` made) is uploaded to moto's S3 server on
127.0.0.1; then each reader runs in a fresh process of its own, ``--runs`` times, while moto's own request
recorder counts what it asks: ``tunekit status`` (the first run builds the readers' index beside the
experiment, later ones read it), ``tunekit report``, ``tunekit verify`` (sizes from one listing, its default
on remote storage) and ``verify --full`` (every byte hashed), and ``load_results``. On a real bucket each
request costs tens of milliseconds, one after another, so the counts are what compare; the times are moto's
on this machine. The targets (at 2,000 trials): ``status`` and ``report`` at most 50 requests plus one per
100 trials (plus those for what disagrees with the index), ``status`` under 3 s, ``verify`` at most one listing
per 1,000 objects plus the index.

Usage::

    python benchmarks/many_trials.py --trials 2000 --variants class+callbacks --keep /tmp/many
    python benchmarks/s3_readers.py /tmp/many/class_callbacks-0 --runs 2

``many_trials.py --storage s3`` runs it on its last experiment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

__all__ = ["measure"]

#: Each reader, as the command line of a fresh process (EXP: the experiment's URI).
READERS = {
    "status": ["-m", "tunekit.cli", "status", "EXP"],
    "report": ["-m", "tunekit.cli", "report", "EXP", "--metric", "loss", "--mode", "min", "--output", "REPORT"],
    "verify": ["-m", "tunekit.cli", "verify", "EXP"],
    "verify --full": ["-m", "tunekit.cli", "verify", "EXP", "--full"],
    "load_results": ["-c", "import sys; from tunekit.analysis import load_results; print(len(load_results(sys.argv[1])))",
                     "EXP"],
}


def _server() -> tuple[str, str]:
    """moto's S3 server on 127.0.0.1 recording its requests; returns its endpoint and the recording's file."""
    import logging

    record = tempfile.mkstemp(prefix="tunekit-s3-readers-", suffix=".jsonl")[1]
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_EC2_METADATA_DISABLED="true",
                      MOTO_RECORDER_FILEPATH=record)
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return f"http://127.0.0.1:{server.get_host_and_port()[1]}", record


def _recorder(endpoint: str, action: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST"),
                           timeout=60).read()


def _requests(record: str) -> list[str]:
    with open(record) as fh:
        return [f"{e['method']} {e['url'].split('?')[0]}" for e in map(json.loads, filter(str.strip, fh))]


def measure(local: str, *, runs: int = 2, out: object = None, show: bool = False) -> dict[str, list[tuple[int, float, int]]]:
    """Upload experiment ``local`` to a fresh moto server and run each reader ``runs`` times; print and return
    reader -> ``(requests, seconds, exit status)`` for each run (``show``: and each request of the last run)."""
    import boto3
    import pyarrow.fs as pafs

    stream = out or sys.stdout
    endpoint, record = _server()
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="readers")
    uri = f"s3://readers/{os.path.basename(local.rstrip('/'))}?endpoint_override={endpoint}&region=us-east-1"
    fs, path = pafs.FileSystem.from_uri(uri)
    files = sum(len(names) for _, _, names in os.walk(local))
    start = time.perf_counter()
    pafs.copy_files(local, path, destination_filesystem=fs, use_threads=False)  # (moto fails some parallel PUTs)
    print(f"s3_readers: {local} ({files} files) uploaded to moto in {time.perf_counter() - start:.1f} s", file=stream)
    trials = sum(1 for name in os.listdir(local) if os.path.isfile(os.path.join(local, name, "params.json")))
    env = {**os.environ, "PYTHONPATH": ROOT}
    results: dict[str, list[tuple[int, float, int]]] = {}
    report_dir = tempfile.mkdtemp(prefix="tunekit-s3-report-")
    for reader, argv in READERS.items():
        for run in range(runs):
            argv_run = [a.replace("EXP", uri).replace("REPORT", os.path.join(report_dir, f"{run}")) for a in argv]
            _recorder(endpoint, "reset-recording")
            _recorder(endpoint, "start-recording")
            start = time.perf_counter()
            done = subprocess.run([sys.executable, *argv_run], env=env, cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            _recorder(endpoint, "stop-recording")
            seen = _requests(record)
            results.setdefault(reader, []).append((len(seen), seconds, done.returncode))
            kinds: dict[str, int] = {}
            for request in seen:
                kinds[request.split()[0]] = kinds.get(request.split()[0], 0) + 1
            print(f"  {reader:14s} run {run + 1}: {len(seen):6d} requests ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}), "
                  f"{seconds:6.2f} s, exit {done.returncode}", file=stream, flush=True)
            if show and run == runs - 1:
                for request in seen:
                    print(f"      {request.replace(endpoint, '')}", file=stream)
            if done.returncode not in (0,):
                print("    " + (done.stdout + done.stderr).strip().splitlines()[-1][:300], file=stream)
    budget = 50 + trials // 100
    print(f"{trials} trials, {files} files; status and report: at most {budget} requests each wanted "
          f"(50 + 1 per 100 trials)", file=stream)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", help="a local experiment directory")
    parser.add_argument("--runs", type=int, default=2, help="runs of each reader (the first status builds the index)")
    parser.add_argument("--show", action="store_true", help="print each request of each reader's last run")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.experiment):
        parser.error(f"{args.experiment}: not a directory (expected a local experiment)")
    results = measure(os.path.abspath(args.experiment), runs=args.runs, show=args.show)
    return 0 if all(code == 0 for runs in results.values() for _, _, code in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
