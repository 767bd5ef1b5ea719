"""The log's section of the run config: chunk sizes and codecs (applied when a segment's arrays are created).

A commit rewrites the partly filled last chunk of each array it touches (padded to a whole chunk, so
no read-modify-write), so chunks are sized to what one commit typically adds: routing rows of a
2k-token turn are ~0.8 MB at 48x8, while its ids, mask and logprobs are a few KB each.

Defaults were picked with ``bench/log_append.py`` (2k-token turns, 48x8 routing) on the development
machine: blosc-lz4 at level 1 is close to free; bitshuffle pays on token ids, masks and logprobs,
while routing ids (near-uniform bytes) do not compress and are cheapest stored with plain lz4.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Shuffle = Literal["noshuffle", "shuffle", "bitshuffle"]


class StorageConfig(BaseModel):
    """Event-log settings. Chunk sizes are bytes of raw payload per chunk (rounded to whole rows)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    routing_chunk_bytes: int = Field(1 << 20, ge=1024, description="bytes per chunk of the routing array")
    vector_chunk_bytes: int = Field(1 << 17, ge=1024, description="bytes per chunk of ids, masks, logprobs, ...")
    header_chunk_bytes: int = Field(1 << 16, ge=1024, description="bytes per chunk of the msgpack header array")
    codec: Literal["lz4", "lz4hc", "zstd", "zlib", "none"] = "lz4"
    clevel: int = Field(1, ge=0, le=9)
    numeric_shuffle: Shuffle = "bitshuffle"
    routing_shuffle: Shuffle = "noshuffle"
    fsync: bool = Field(False, description="fsync chunks and commit records (survive a power cut, not only a "
                        "killed process); LocalStore only, object stores are durable on put")
    cache_chunks: int = Field(32, ge=1, description="decoded chunks a reader keeps per array")
    readahead_chunks: int = Field(8, ge=1, description="chunks a reader fetches at once on a miss")
