from pathlib import Path


def test_words_file_exists():
    assert Path("/app/words.txt").is_file()


def test_word_count():
    assert Path("/app/words.txt").read_text().strip() == "14"


def test_line_count():
    assert Path("/app/lines.txt").read_text().strip() == "4"


def test_poem_untouched():
    assert Path("/app/poem.txt").read_text().startswith("the fog comes\n")
