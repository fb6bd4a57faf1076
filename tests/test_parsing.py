import pytest

from corpus.parsing import ParseError, parse_bytes
from tests.support.files import make_eml, make_mbox, make_pdf


def test_markdown_title_and_code_and_text():
    [doc] = parse_bytes(b"# Install guide\n\nRun make.", "docs/install.md")
    assert (doc.title, doc.kind) == ("Install guide", "markdown")
    [code] = parse_bytes(b"def f():\n    return 1\n", "pkg/mod.py")
    assert code.kind == "code" and code.title == "mod.py"
    [plain] = parse_bytes(b"just words", "notes.txt")
    assert plain.kind == "text"


def test_html_uses_extractor_and_page_title():
    html = b"<html><head><title>Pricing</title></head><body><nav>Home | About</nav><article><h1>Pricing</h1><p>" + b"The plan costs ten euros per seat per month. " * 5 + b"</p></article></body></html>"
    [doc] = parse_bytes(html, "/pricing.html")
    assert doc.kind == "html" and doc.title == "Pricing"
    assert "ten euros per seat" in doc.text


def test_pdf_text_layer():
    [doc] = parse_bytes(make_pdf("Quarterly revenue grew 12 percent."), "report.pdf")
    assert doc.kind == "pdf" and "Quarterly revenue grew 12 percent" in doc.text


def test_eml_and_mbox():
    [mail] = parse_bytes(make_eml("Budget", "The budget is approved."), "a.eml")
    assert mail.title == "Budget" and "approved" in mail.text and mail.kind == "email"
    docs = parse_bytes(make_mbox([("One", "first body"), ("Two", "second body")]), "box.mbox")
    assert [d.title for d in docs] == ["One", "Two"] and [d.part for d in docs] == ["msg0", "msg1"]


@pytest.mark.parametrize(
    "data, name, reason",
    [
        (b"\x00\x01\x02binary", "blob.txt", "binary"),
        (b"\xff\xfe\xfa broken", "latin.txt", "invalid UTF-8"),
        (make_pdf("cut")[:-40], "cut.pdf", "truncated PDF"),
        (b"not a pdf at all", "fake.pdf", "not a PDF"),
        (b"", "empty.md", "empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image.png", "binary"),
    ],
)
def test_bad_inputs_raise_with_reason(data, name, reason):
    with pytest.raises(ParseError, match=reason):
        parse_bytes(data, name)
