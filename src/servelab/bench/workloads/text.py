"""Prompt text of an exact token length: the built-in vocabulary (English and Chinese words) and
:class:`TextMaker`, which fits generated text to a target count in one tokenizer (or approximates it
without one, at :data:`WORDS_PER_TOKEN`). Used by every workload that builds its own prompts."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from servelab.wire import ConfigError

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["EN_WORDS", "WORDS_PER_TOKEN", "ZH_WORDS", "TextMaker"]


#: Approximate words per token when no tokenizer is given.
WORDS_PER_TOKEN = 0.75

# A varied built-in vocabulary (common English + technical words). Varied text keeps tokenization
# and prefix-cache behaviour representative (one repeated word would compress to a few tokens).
EN_WORDS = """
the of and to in is that for it as was with be by on not this are or from at which but have an they you
were her she there one all we their been has when who will more no if out so said what up its about into
than them can only other new some could time these two may then do first any my now such like our over
even most made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see work long get here
between both life being under never day same another know while last might us great old year off come
since against go came right used take three system data model server request latency memory cache token
network storage cluster region policy budget report team customer product market price cost energy
water city river mountain forest garden kitchen window window table chair paper letter music film book
library museum school student teacher doctor patient hospital medicine health weather winter summer
spring autumn morning evening history science physics chemistry biology language grammar sentence
question answer problem solution method result evidence analysis review summary chapter section figure
engine pipeline deployment version release feature bug test benchmark metric throughput queue batch
kernel thread process signal timeout error warning retry backup archive record field column index query
travel airport station ticket journey border island harbor bridge tunnel highway vehicle bicycle train
farmer harvest wheat rice coffee bread cheese apple orange lemon sugar salt pepper onion garlic recipe
contract invoice payment account balance credit loan interest tax salary office meeting agenda minute
project milestone deadline schedule calendar holiday festival ceremony election council court judge law
ancient modern quiet bright careful sudden gentle brave clever honest simple complex rapid slow heavy
light narrow broad fresh frozen hidden visible local global public private digital physical natural
build design measure compare explain describe improve reduce increase support protect prevent allow
require provide create deliver manage follow choose decide discover observe record update restore
carefully quickly rarely often usually gradually finally recently nearly almost perhaps certainly
""".split()

ZH_WORDS = """
我们 今天 系统 服务 模型 推理 请求 延迟 吞吐 缓存 显存 用户 数据 网络 城市 河流 山区 森林 学校 学生
老师 医院 医生 天气 冬天 夏天 春天 历史 科学 语言 问题 答案 方法 结果 证据 分析 报告 章节 版本 功能
测试 指标 队列 批处理 部署 项目 会议 计划 预算 成本 价格 市场 产品 客户 团队 政策 文件 记录 更新 恢复
需要 提供 创建 管理 选择 决定 发现 观察 比较 解释 描述 改进 降低 增加 支持 保护 防止 允许 快速 缓慢
简单 复杂 公开 私有 本地 全球 清晰 稳定 安全 可靠 重要 主要 已经 正在 可能 因此 但是 而且 如果 虽然
""".split()


class TextMaker:
    """Builds prompt text of an exact token length for one tokenizer (or approximate without one)."""

    def __init__(self, counter: TokenCounter | None, lang: str) -> None:
        if lang not in ("en", "zh", "mixed"):
            raise ConfigError(f"bad lang={lang!r}: use en, zh or mixed")
        self.counter = counter
        self.lang = lang
        self._word_tokens: dict[str, int] = {}
        self._count_cache: dict[str, int] = {}
        if counter is not None:  # per-word token counts, once, in one batch (used only to size the body)
            words = sorted({w.capitalize() for w in EN_WORDS} | set(EN_WORDS) | set(ZH_WORDS))
            self._word_tokens = dict(zip(words, map(len, counter.encode_batch([" " + w for w in words])), strict=True))

    # -- raw text ---------------------------------------------------------------------------------
    def sentence(self, rng: random.Random) -> str:
        zh = self.lang == "zh" or (self.lang == "mixed" and rng.random() < 0.5)
        if zh:
            return "".join(rng.choice(ZH_WORDS) for _ in range(rng.randint(4, 12))) + rng.choice("。。。！？")
        words = [rng.choice(EN_WORDS) for _ in range(rng.randint(6, 18))]
        words[0] = words[0].capitalize()
        if len(words) > 8 and rng.random() < 0.4:
            words[rng.randint(3, len(words) - 3)] += ","
        return " ".join(words) + rng.choice("....!?")

    def words_text(self, rng: random.Random, approx_tokens: int, para_every: int = 0) -> str:
        """Sentences totalling at least ``approx_tokens`` (estimated from cached per-word counts).
        With ``para_every`` > 0, a new numbered paragraph ``[k] `` starts every ``para_every`` sentences."""
        parts: list[str] = ["[1] "] if para_every else []
        est = 0
        k = 0
        while est < approx_tokens:
            s = self.sentence(rng)
            est += self._estimate(s) + (3 if para_every and k % para_every == 0 else 0)
            if k:
                if para_every and k % para_every == 0:
                    parts.append(f"\n[{k // para_every + 1}] ")
                else:
                    parts.append(" ")
            parts.append(s)
            k += 1
        return "".join(parts)

    def _estimate(self, sentence: str) -> int:
        if self.counter is None:
            return max(1, math.ceil(len(sentence.split()) / WORDS_PER_TOKEN)) if " " in sentence else len(sentence)
        total = 0
        for w in sentence.split(" "):
            c = self._word_tokens.get(w)
            if c is None:
                c = self.counter.count(" " + w)
                self._word_tokens[w] = c
            total += c
        return total

    def count(self, text: str) -> int:
        """Token count with a small cache (fixed heads/tails repeat across requests)."""
        assert self.counter is not None
        if len(text) <= 512:
            c = self._count_cache.get(text)
            if c is None:
                c = self._count_cache[text] = self.counter.count(text)
            return c
        return self.counter.count(text)

    # -- exact fitting --------------------------------------------------------------------------------
    def fit(
        self,
        rng: random.Random,
        target: int,
        head: str = "",
        tail: str = "",
        para_every: int = 0,
        lower_first: bool = False,
    ) -> str:
        """Return ``head + body + tail`` whose token count is exactly ``target`` (``_tokens``).

        The body is generated text cut at a token boundary: tokenize, cut, decode, re-count, adjust the
        cut until exact. If ``head``/``tail`` leave no room, the tail and then the head are dropped.
        Without a tokenizer, returns about ``target`` tokens' worth of words (0.75 words per token).
        Raises RuntimeError if no exact cut exists (not seen with SentencePiece/BPE tokenizers).
        """
        if self.counter is None:
            n_words = max(1, round(target * WORDS_PER_TOKEN) - len((head + " " + tail).split()))
            body = " ".join(self.words_text(rng, n_words + 20).split(" ")[:n_words])
            return head + (body[:1].lower() + body[1:] if lower_first else body) + tail
        fixed = self.count(head) + self.count(tail) if (head or tail) else 0
        if fixed + 1 > target and tail:
            return self.fit(rng, target, head, "", para_every, lower_first)
        if fixed + 1 > target and head:
            return self.fit(rng, target, "", "", para_every, lower_first)
        body_src = self.words_text(rng, target - fixed + 16, para_every)
        if lower_first:
            body_src = body_src[:1].lower() + body_src[1:]
        ids = self.counter.encode(body_src)
        while len(ids) < target - fixed + 8:  # estimate was short (rare): extend
            body_src += " " + self.words_text(rng, target - fixed, para_every)
            ids = self.counter.encode(body_src)
        decode = self.counter.decode
        count = self.counter.count
        budget = target - fixed
        seen: dict[int, int] = {}
        for _ in range(10):
            budget = max(1, min(len(ids), budget))
            if budget in seen:
                break
            text = head + decode(ids[:budget]).rstrip("\ufffd") + tail
            c = count(text)
            seen[budget] = c
            if c == target:
                return text
            budget += target - c
        # Oscillating at a merge boundary: scan cuts near the estimate, then try a one-word nudge.
        center = budget
        for delta in range(1, 24):
            for b in (center - delta, center + delta):
                if 1 <= b <= len(ids) and b not in seen:
                    text = head + decode(ids[:b]).rstrip("\ufffd") + tail
                    c = seen[b] = count(text)
                    if c == target:
                        return text
        for filler in (".", ",", " a", " the", "\n"):
            for b in sorted(seen, key=lambda b: abs(seen[b] - target)):
                text = head + decode(ids[:b]).rstrip("\ufffd") + filler + tail
                if count(text) == target:
                    return text
        raise RuntimeError(f"could not build a prompt of exactly {target} tokens with {self.counter.name}")
