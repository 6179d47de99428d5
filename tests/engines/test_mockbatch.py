"""The mock engine's continuous-batching timing law (servelab.engines.mock.batch), read from the
mock's own write stamps (``/mock/records``): first token after ``ttft_ms + prompt / rate``, chunk gaps
``itl_ms + itl_ms_per_running * (b - 1)`` with ``b`` the answers decoding at once, ``max_inflight`` slots."""

from __future__ import annotations

import asyncio
import statistics

import aiohttp

from servelab.engines.mock import MockConfig, start_mock

LAW = dict(
    dialect="llamacpp",
    ttft_ms=30.0,
    itl_ms=12.0,
    prefill_tokens_per_s=5000.0,
    itl_ms_per_running=6.0,
    max_inflight=3,
    output_tokens=24,
)


async def _run(words: list[int], at_once: bool) -> list:
    server = await start_mock(MockConfig(**LAW))  # type: ignore[arg-type]
    try:
        async with aiohttp.ClientSession() as s:

            async def one(n: int) -> None:
                body = {"messages": [{"role": "user", "content": "w " * n}], "stream": True, "max_tokens": 24}
                async with s.post(server.base_url + "/chat/completions", json=body) as r:
                    await r.read()

            if at_once:
                await asyncio.gather(*(one(n) for n in words))
            else:
                for n in words:
                    await one(n)
        return list(server.records)
    finally:
        await server.close()


def _gaps_ms(rec) -> list[float]:
    return [(b - a) / 1e6 for a, b in zip(rec.token_write_ns, rec.token_write_ns[1:], strict=False)]


def test_alone_prefill_and_itl_follow_the_law() -> None:
    recs = asyncio.run(_run([100, 600], at_once=False))
    for rec, words in zip(recs, [100, 600], strict=True):
        ttft_ms = (rec.token_write_ns[0] - rec.recv_ns) / 1e6
        want = LAW["ttft_ms"] + words / LAW["prefill_tokens_per_s"] * 1e3
        assert abs(ttft_ms - want) < 0.1 * want, (words, ttft_ms, want)
        assert abs(statistics.mean(_gaps_ms(rec)) - LAW["itl_ms"]) < 0.1 * LAW["itl_ms"]


def test_batch_slows_each_token_and_slots_queue() -> None:
    recs = asyncio.run(_run([50] * 4, at_once=True))
    first = sorted(r.token_write_ns[0] for r in recs)
    # 3 slots: the 4th starts when one frees, after the first three have finished
    assert first[3] > min(r.done_ns for r in recs if r.done_ns)
    three = [r for r in recs if r.token_write_ns[0] in first[:3]]
    # while all three decode together, each gap is itl + 2 * per_running (the first gaps see the others joining)
    mid = [g for r in three for g in _gaps_ms(r)[3:-3]]
    want = LAW["itl_ms"] + 2 * LAW["itl_ms_per_running"]
    assert abs(statistics.mean(mid) - want) < 0.1 * want, (statistics.mean(mid), want)
    alone = [r for r in recs if r.token_write_ns[0] == first[3]][0]
    assert abs(statistics.mean(_gaps_ms(alone)[2:]) - LAW["itl_ms"]) < 0.15 * LAW["itl_ms"]
