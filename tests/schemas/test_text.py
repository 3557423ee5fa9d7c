import json

from hypothesis import given
from hypothesis import strategies as st

from schemas.text import has_tokens, tokenize
from training.text import PAD, UNK, Vocabulary, embedding_matrix


def test_tokenizer_lowercases_and_splits_punctuation():
    assert tokenize("I painted a RED star, it's done!") == [
        "i",
        "painted",
        "a",
        "red",
        "star",
        ",",
        "it's",
        "done",
        "!",
    ]


def test_tokenizer_keeps_urls_handles_and_numbers_whole():
    assert tokenize("see http://imgur.com/a/xyz @bob #diy 3/4 inch :)") == [
        "see",
        "http://imgur.com/a/xyz",
        "@bob",
        "#diy",
        "3/4",
        "inch",
        ":)",
    ]


def test_punctuation_only_sentence_has_no_tokens():
    assert not has_tokens("!!! ... ?")
    assert not has_tokens("   ")
    assert has_tokens("ok.")


@given(st.text(max_size=60))
def test_tokens_never_contain_whitespace(text):
    assert all(tok and not any(c.isspace() for c in tok) for tok in tokenize(text))


def test_vocabulary_min_count_and_reserved_ids():
    sents = ["a red star"] * 5 + ["a blue star"] * 4
    vocab = Vocabulary.build(sents, min_count=5)
    assert vocab.words[:2] == ["<pad>", "<unk>"]
    assert set(vocab.words[2:]) == {"a", "red", "star"}  # "blue" seen only 4 times
    ids = vocab.encode("a blue star", max_tokens=20)
    assert ids[1] == UNK and PAD not in ids
    assert vocab.encode("a red star a red star", max_tokens=2) == [*ids[:1], vocab.index["red"]]


def test_glove_vectors_load_offline_and_cover_common_words():
    vocab = Vocabulary(["<pad>", "<unk>", "red", "circle", "zzqqxxyy"])
    mat, hit = embedding_matrix(vocab, "glove")
    assert mat.shape == (5, 50)
    assert hit == 2 / 3
    assert not mat[0].any()  # PAD row is zero

    assert (abs(mat[2]) > 0.2).any()  # a real GloVe vector, not the uniform init
    assert (abs(mat[4]) <= 0.2).all()  # missing word: U(-0.2, 0.2)


@given(
    st.recursive(st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)
)
def test_repaired_strings_always_encode_and_valid_ones_are_untouched(value):
    from schemas.text import repair_strings

    fixed, n = repair_strings(value)
    json.dumps(fixed, ensure_ascii=False).encode("utf-8")  # raises on any lone surrogate left
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        assert (fixed, n) == (value, 0)
    except UnicodeEncodeError:
        assert n > 0


def test_repair_surrogates():
    """The one text repair (imgur captions, every JSON source through repair_strings)."""
    from schemas.text import repair_surrogates, repair_text

    assert repair_surrogates("plain \ufffd") == ("plain \ufffd", 0)
    assert repair_surrogates("a\ud83db\ude00\ud83d\ude00") == ("a\ufffdb\ufffd\U0001f600", 2)
    assert repair_surrogates("\udfff\ud800") == ("\ufffd\ufffd", 2)
    assert repair_text("half \ud83d here") == ("half \ufffd here", True)
    assert repair_text("plain \ufffd") == ("plain \ufffd", False)
