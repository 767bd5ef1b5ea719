"""The log's section of the run config: chunk sizes and codecs (applied when a segment's arrays are created).

Off a directory (fsspec, memory stores) a commit rewrites the partly filled last chunk of each array
it touches (padded to a whole chunk, so no read-modify-write), so chunks are sized to what one commit
typically adds: routing rows of a 2k-token turn are ~0.8 MB at 48x8, while its ids, mask and
logprobs are a few KB each. On a directory rows go straight into one file per array and chunk size
only sets the granularity of the checksums that name a damaged chunk.

Defaults were picked with ``bench/log_append.py`` (2k-token turns, 48x8 routing) on the development
machine. Routing ids are ~97% of the bytes and near-uniform: no general-purpose codec shrinks them,
and any codec costs more CPU per byte than writing them (blosc-lz4 alone held appends to ~0.1-0.3 of
a raw file). So the default is no byte compression: on a directory the arrays are then packed into
one file each. Routing is instead stored as sets (``routing_encoding="sets"``): the order of the k
ids of a selection means nothing to R3, and a top-8 set of 256 takes 49 bits instead of 64 (294
B/token at 48 x 8 instead of 384; ``bench/routing_codec.py`` measures what that costs in CPU).
``routing_encoding="ids"`` keeps one id per byte in the router's order, at raw-file speed.
``codec="lz4"`` (bitshuffle on ids, masks, logprobs) trades speed for smaller token arrays and
keeps zarr's one-file-per-chunk layout.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Shuffle = Literal["noshuffle", "shuffle", "bitshuffle"]


class StorageConfig(BaseModel):
    """Event-log settings. Chunk sizes are bytes of raw payload per chunk (rounded to whole rows)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(None, description="the log's root on an object store, s3://BUCKET/PREFIX (credentials "
                            "and endpoint from the standard AWS variables, AWS_ENDPOINT_URL included); None: the "
                            "run directory's log/. The run directory keeps everything else (t1_actors/layout.py)")
    routing_chunk_bytes: int = Field(1 << 20, ge=1024, description="bytes per chunk of the routing array")
    vector_chunk_bytes: int = Field(1 << 17, ge=1024, description="bytes per chunk of ids, masks, logprobs, ...")
    header_chunk_bytes: int = Field(1 << 16, ge=1024, description="bytes per chunk of the msgpack header array")
    routing_encoding: Literal["sets", "ids"] = Field(
        "sets", description="sets: each (token, layer) top-k selection stored as its combinatorial number "
        "(log2 C(E, k) bits; read back sorted ascending within the set); ids: one id per byte (E <= 256) "
        "in the order given. Logs of format 2 and shapes whose sets need more than 64 bits keep ids")
    codec: Literal["lz4", "lz4hc", "zstd", "zlib", "none"] = Field(
        "none", description="Blosc compressor of the log's arrays (routing sets excepted: already at their entropy); "
        "none: raw bytes, packed into one file per array on a directory; a codec trades CPU for smaller token "
        "arrays and keeps zarr's one-file-per-chunk layout")
    clevel: int = Field(1, ge=0, le=9, description="compression level of codec (0: none, 9: smallest, slowest)")
    numeric_shuffle: Shuffle = Field("bitshuffle", description="Blosc shuffle filter of every array but routing ids "
                                     "(token ids, masks, logprobs, headers) when a codec is set")
    routing_shuffle: Shuffle = Field("noshuffle", description="Blosc shuffle filter of the routing ids array "
                                     "(routing stored as ids) when a codec is set")
    reserve_min_bytes: int = Field(64 << 10, ge=0, description="writes to a packed array of at least this "
                                   "many bytes (routing records) first reserve their disk blocks in one call "
                                   "(fallocate; ~1.35x faster writes on ext4, used there only); 0 turns it off")
    fsync: bool = Field(False, description="fsync chunks and commit records (survive a power cut, not only a "
                        "killed process); LocalStore only, object stores are durable on put")
    lease_s: float = Field(30.0, ge=0.5, description="object stores (S3): a writer's lease on its segment; a "
                           "killed writer's segment reopens this long after its last commit (2 s after it is seen dead "
                           "from its own machine: storage/_lease.py)")
    cache_chunks: int = Field(32, ge=1, description="decoded header chunks a reader keeps")
    readahead_chunks: int = Field(8, ge=1, description="header chunks a reader fetches at once on a miss")
    read_block_bytes: int = Field(16 << 20, ge=0, description="payload bytes a reader fetches in one read per "
                                  "array for consecutive events; the events' arrays are views of that block "
                                  "(so a record kept alive keeps its block alive)")

    @field_validator("url")
    @classmethod
    def _s3_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        scheme, sep, rest = url.partition("://")
        bucket, _, prefix = rest.partition("/")
        if not sep or scheme not in ("s3", "s3a") or not bucket or not prefix.strip("/"):
            raise ValueError(f"url = {url!r}: expected s3://BUCKET/PREFIX (a prefix of its own for this run's log; "
                             "leave url out to keep the log in the run directory)")
        return url.rstrip("/")
