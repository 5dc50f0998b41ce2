"""Build analysis/corpus/: the real text the quality gate trains on (`trainscout verify --quality`), and its
tokenizer, both shipped with the package (no download at run time; the GPU machine has no network).

The text: six public-domain English books (Project Gutenberg's plain-text editions without their licence
header and footer, as the gutenbergbooks/* GitHub mirrors carry them) and Shakespeare (karpathy/char-rnn's
tinyshakespeare), 4.2 MB in all, concatenated in this order with a blank line between them. The tokenizer: a
byte-level BPE of 8,192 tokens trained on that text with Hugging Face tokenizers (ids < 8,192 fit any model's
vocabulary). Reproduce:
    python bench/build_corpus.py BOOKS_DIR   # BOOKS_DIR holds 11.txt 84.txt 1342.txt 1661.txt 2701.txt shakespeare.txt
"""
import gzip
import os
import sys

BOOKS = ("11.txt", "84.txt", "1342.txt", "1661.txt", "2701.txt", "shakespeare.txt")
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis", "corpus")


def main(src: str) -> None:
    from trainscout.analysis.quality import VOCAB, train_tokenizer
    parts = []
    for name in BOOKS:
        with open(os.path.join(src, name), encoding="utf-8") as f:
            text = f.read()
        start, end = text.find("*** START OF"), text.find("*** END OF")
        if start >= 0:  # Moby-Dick's mirror keeps Gutenberg's markers: the book alone
            text = text[text.index("\n", start) + 1:end if end > start else None]
        parts.append(text.strip().replace("\r\n", "\n"))
    text = "\n\n".join(parts) + "\n"
    os.makedirs(OUT, exist_ok=True)
    with gzip.GzipFile(os.path.join(OUT, "books.txt.gz"), "wb", mtime=0) as f:  # mtime 0: the same bytes each build
        f.write(text.encode("utf-8"))
    tok = train_tokenizer(text, VOCAB)
    with gzip.GzipFile(os.path.join(OUT, "tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(tok.to_str().encode("utf-8"))
    ids = tok.encode(text).ids
    print(f"{len(text):,} characters, {len(ids):,} tokens, vocabulary {tok.get_vocab_size():,}")


if __name__ == "__main__":
    main(sys.argv[1])
