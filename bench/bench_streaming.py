"""Benchmark of the streaming chat-completions adapter against reading the same bytes.

Run: ``python bench/bench_streaming.py`` (a few seconds; ``--chunks N`` changes the answer).

Workload: one streamed answer of ``N`` (default 4000) ``chat.completion.chunk`` events of a
few characters each, plus a usage chunk and ``[DONE]``, served by the loopback fake
(``tests/fakeprovider.py``) with no pauses.

Physical baseline, measured in the same run: ``raw``, an ``httpx2`` client that POSTs to the
same server and reads the whole chunked body — the least any client must do to receive the
answer. Contender: ``adapter``, ``OpenAICompatibleModel.complete()`` with an ``on_delta`` sink:
the SDK request, the SSE decoding, one JSON parse per chunk, reassembly, the watchdog thread
hand-off of every delta, and the final validation.

Printed figures: ``stream.adapter`` against ``raw`` (the ratio is tether's per-answer cost of
streaming over the transfer itself) and the per-chunk overhead in microseconds.

Estimator: rounds that run both once, in rotating order; the best (minimum) per contender.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx2

from fakeprovider import Canned, FakeProvider, chunk, sse_data
from tether._models.base import ModelRequest
from tether._models.openai_compat import OpenAICompatibleModel


def answer(chunks: int) -> Canned:
    pieces = [(0.0, sse_data(chunk(content=f"w{i} "))) for i in range(chunks)]
    pieces.append((0.0, sse_data(chunk(finish_reason="stop"))))
    pieces.append((0.0, sse_data(chunk(no_choices=True, usage={"prompt_tokens": 5}))))
    pieces.append((0.0, sse_data("[DONE]")))
    # One write per piece would time the fake, not the client: send them in 64 KiB blocks.
    data = b"".join(p for _, p in pieces)
    blocks = tuple((0.0, data[i : i + 65536]) for i in range(0, len(data), 65536))
    return Canned(chunks=blocks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    fake = FakeProvider()
    model = OpenAICompatibleModel("fake/model", base_url=fake.base_url, api_key="bench-key")
    client = httpx2.Client(timeout=30)
    request = ModelRequest(system_prompt="", messages=[{"role": "user", "content": "go"}])
    best = {"raw": float("inf"), "adapter": float("inf")}
    deltas = 0

    def raw() -> None:
        fake.enqueue(answer(args.chunks))
        with client.stream(
            "POST", f"{fake.base_url}/chat/completions", json={"model": "m", "stream": True}
        ) as response:
            for _ in response.iter_bytes():
                pass

    def adapter() -> None:
        nonlocal deltas
        deltas = 0

        def sink(_: object) -> None:
            nonlocal deltas
            deltas += 1

        fake.enqueue(answer(args.chunks))
        model.complete(request, on_delta=sink)

    contenders = [("raw", raw), ("adapter", adapter)]
    try:
        for round_ in range(args.rounds):
            order = contenders[round_ % 2 :] + contenders[: round_ % 2]
            for name, run in order:
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
    finally:
        client.close()
        model.close()
        fake.close()
    assert deltas == args.chunks
    ratio = best["adapter"] / best["raw"]
    per_chunk = (best["adapter"] - best["raw"]) / args.chunks * 1e6
    print(f"chunks: {args.chunks}, rounds: {args.rounds}")
    print(f"raw      {best['raw'] * 1000:8.2f} ms  (httpx2 reads the body: physical baseline)")
    print(f"adapter  {best['adapter'] * 1000:8.2f} ms  (complete() with on_delta)")
    print(f"stream.adapter / raw = {ratio:.2f}x; overhead {per_chunk:.1f} µs per chunk")


if __name__ == "__main__":
    main()
