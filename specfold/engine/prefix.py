"""Prefix-cache keys: which tokens a full KV block's K/V depend on, hashed.

A position's K/V depend on every token up to the end of its *group*: the diffusion block for a
block-causal program (its queries see the whole block, counted from absolute position 0), one
token for a causal one (Nemotron-Labs-Diffusion's prefix, the AR and LinearSpec programs). So the
key of KV block i (positions [i*bs, (i+1)*bs)) covers the tokens [0, e_i), e_i = the end of the
group of its last position:

    chain_i = H(chain_{i-1} | tokens of block i)          chain_{-1} = H(salt)
    key_i   = H(chain_i | tokens [(i+1)*bs, e_i))

and the salt names what else changes K/V: the model, its dtype, the block size and the group.
H is BLAKE2b (16 bytes): two prefixes share a key only if their tokens are equal, short of a
cryptographic collision. Host data only.
"""
from __future__ import annotations

import hashlib
from array import array


def _h(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"|".join(parts), digest_size=16).digest()


def _b(tokens: list[int]) -> bytes:
    return array("q", tokens).tobytes()


class PrefixKeys:
    def __init__(self, salt: str, block_size: int, group: int):
        self.root = _h(salt.encode())
        self.bs, self.group = block_size, group

    def end(self, i: int) -> int:
        """e_i: the end of the tokens block i's K/V depend on."""
        hi = (i + 1) * self.bs
        return -(-hi // self.group) * self.group

    def keys(self, tokens: list[int], first: int, chain: list[bytes], limit: int) -> list[bytes]:
        """The keys of blocks first, first+1, ... whose group ends at or before `limit` (<= len(tokens)),
        extending `chain` (the chain hashes of blocks [0, first)) in place."""
        out = []
        i = first
        while self.end(i) <= limit:
            lo, hi = i * self.bs, (i + 1) * self.bs
            if len(chain) <= i:
                chain.append(_h(chain[i - 1] if i else self.root, _b(tokens[lo:hi])))
            out.append(_h(chain[i], _b(tokens[hi: self.end(i)])))
            i += 1
        return out
