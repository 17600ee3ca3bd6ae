"""The digests against their libraries (the file ones on a file larger than one read
chunk), and the values mriprep records, pinned."""

import hashlib
import json

import numpy as np
import xxhash

from mriprep.core.hashing import CHUNK_BYTES, checksum_file, file_checksum, sha256_file


def _file_of_chunks(tmp_path, n_bytes):
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, n_bytes, dtype=np.uint8).tobytes())
    return path


def test_sha256_file_matches_hashlib(tmp_path):
    path = _file_of_chunks(tmp_path, 2 * CHUNK_BYTES + 17)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_checksum_matches_xxh3_of_the_whole_file_with_any_buffer(tmp_path):
    path = _file_of_chunks(tmp_path, CHUNK_BYTES + 5)
    expected = xxhash.xxh3_128(path.read_bytes()).hexdigest()
    assert checksum_file(path) == expected
    # A buffer that does not divide the file still covers every byte once.
    assert file_checksum(path, bytearray(4093)) == (expected, CHUNK_BYTES + 5)


def test_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert file_checksum(path) == (xxhash.xxh3_128(b"").hexdigest(), 0)
    assert sha256_file(path) == hashlib.sha256(b"").hexdigest()


# -- the values mriprep records: pinned, so that a change of recipe is caught here ----------
# Every value below was computed before the hashing moved into mriprep.core.hashing; an
# existing cache, its keys and checksums, and the identity reference depend on them.


def test_hash_json_is_the_sha256_of_the_sorted_json_text():
    from mriprep.core.hashing import hash_json

    doc = {"b": [1, 2], "a": {"z": 1, "y": None}}
    assert hash_json(doc) == hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    assert hash_json({"x": (1, 2)}, default=list) == hash_json({"x": [1, 2]})


def test_the_other_digests_match_their_libraries():
    from mriprep.core.hashing import new_checksum, sha256_bytes, sha256_hex, short_digest

    assert sha256_hex("ab", b"c") == hashlib.sha256(b"abc").hexdigest()
    assert sha256_bytes("é") == hashlib.sha256("é".encode()).digest()
    assert sha256_hex(np.arange(4, dtype=np.int16).reshape(2, 2)) == \
        hashlib.sha256(np.arange(4, dtype=np.int16).tobytes()).hexdigest()
    assert short_digest("sub-01/x") == hashlib.blake2b(b"sub-01/x", digest_size=16).digest()
    running = new_checksum(b"head")
    running.update(b"tail")
    assert running.hexdigest() == xxhash.xxh3_128(b"headtail").hexdigest()


def test_cache_keys_are_unchanged():
    from mriprep.cache import entry_key

    assert entry_key("sub-01", "ses-1", {"image": "a" * 64, "label": "b" * 64}, "c" * 64) == \
        "92dce93b08c271b411491612e45e8780b62e614d50e46bb008eecf1f53e914d7"
    assert entry_key("sub-01", "", {"image": "a" * 64}, "c" * 64, header="sform") == \
        "33c962d3495346d0a6f3cbdaff8dfdaf5321902d18ea6fbf39edeb354446e23e"


def test_tensor_checksum_from_memory_is_unchanged():
    from mriprep.cache import npy_checksum

    assert npy_checksum(np.arange(24, dtype=np.int16).reshape(2, 3, 4)) == \
        ("0202720bef956312c94d30ed0577c0ef", 176)


def test_split_draws_and_fold_seeds_are_unchanged():
    from mriprep.splits.assignment import subject_draw

    assert subject_draw("sub-01", 7) == 0.21182061839817795
    # The fold assignment's random state, as _sklearn_folds derives it.
    from mriprep.core.hashing import sha256_bytes
    assert int.from_bytes(sha256_bytes("mriprep-folds\0" "7")[:4], "big") == 533937900


def test_template_digest_label_table_and_augment_seed_are_unchanged():
    from mriprep.inputs.templates import template_digest
    from mriprep.training.augment.params import sample_seed
    from mriprep.training.labels.table import dkt_table

    assert template_digest("mni152") == \
        "a852b7054c512d2cbd608b17442aa149491db3f96af60d2b6c84ab181c37a9ed"
    assert dkt_table().hash() == \
        "6878416b4e9130dd01042ee91579a4b738d8cd8000309ffd3c24b8060a205549"
    assert sample_seed(1, 2, "sub-01/x").entropy == [1, 2, 1005266739, 4112947628, 93050201,
                                                     4092848911]


def test_the_default_pipeline_hashes_to_the_one_the_identity_reference_records():
    """The identity reference was made on the default pipeline's caches: its recorded
    hash is the pipeline hash of this version (a version bump rebuilds the reference)."""
    from mriprep.pipelines import load_pipeline
    from mriprep.splits.reference import REFERENCE_PATH

    recorded = np.load(REFERENCE_PATH)["pipeline"]
    assert recorded[0] == "t1w_mni_rigid"
    assert load_pipeline("t1w_mni_rigid").hash == recorded[1] == \
        "9a4f592d7eef03415e07d6c67b7797f877892f809f55ed4cc8b86f71a75dac63"
