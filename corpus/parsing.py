"""Bytes to clean text: text, markdown, code, HTML, PDF, e-mail (.eml and mbox).

A parser either returns documents or raises `ParseError` with a reason a person can act on;
the sync records that reason in the quarantine table. An mbox yields one document per message.
"""

from __future__ import annotations

import email
import email.policy
import io
import mailbox
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

CODE_SUFFIXES = {
    ".py", ".js", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java", ".kt", ".c", ".h", ".cc", ".cpp", ".hpp",
    ".cs", ".rb", ".php", ".swift", ".scala", ".sh", ".bash", ".sql", ".r", ".lua", ".pl", ".m", ".yaml",
    ".yml", ".toml", ".json", ".ini", ".cfg", ".mk", ".cmake", ".proto", ".css", ".scss",
}
TEXT_SUFFIXES = {".txt", ".text", ".rst", ".csv", ".tsv", ".log", ".tex", ""}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdx"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
TEXT_FILENAMES = {"Makefile", "Dockerfile", "LICENSE", "README", "CHANGELOG", "NOTICE", "AUTHORS"}


class ParseError(ValueError):
    pass


@dataclass(frozen=True)
class ParsedDocument:
    title: str
    text: str
    kind: str  # text | markdown | code | html | pdf | email
    part: str = ""  # sub-document key, e.g. the message index inside an mbox
    metadata: dict[str, str] = field(default_factory=dict)


def _decode_text(data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise ParseError("binary content (NUL bytes) in a text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ParseError(f"invalid UTF-8 encoding at byte {error.start}") from None
    control = sum(1 for ch in text[:8192] if ord(ch) < 32 and ch not in "\n\r\t\f")
    if control > 0.05 * max(1, min(len(text), 8192)):
        raise ParseError("binary content (control characters) in a text file")
    return text


def _stem_title(name: str) -> str:
    return PurePosixPath(name).name or name


def _markdown_title(text: str, fallback: str) -> str:
    match = re.search(r"^#\s+(.+)$", text, flags=re.MULTILINE)
    return match.group(1).strip() if match else fallback


def parse_html(data: bytes, fallback_title: str) -> ParsedDocument:
    import trafilatura

    try:
        html = data.decode("utf-8")
    except UnicodeDecodeError:
        html = data.decode("latin-1")
    text = trafilatura.extract(html, include_comments=False, include_tables=True, favor_recall=True)
    meta = trafilatura.extract_metadata(html)
    title = (meta.title if meta and meta.title else None) or fallback_title
    if not text or not text.strip():
        raise ParseError("HTML page has no extractable main text")
    return ParsedDocument(title=title, text=text.strip(), kind="html")


def parse_pdf(data: bytes, fallback_title: str) -> ParsedDocument:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    if not data.startswith(b"%PDF-"):
        raise ParseError("not a PDF (missing %PDF- header)")
    if b"%%EOF" not in data[-2048:]:
        raise ParseError("truncated PDF (no %%EOF marker at the end)")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        pages = [page.extract_text() or "" for page in reader.pages]
        title = (reader.metadata.title if reader.metadata and reader.metadata.title else None) or fallback_title
    except (PdfReadError, ValueError, KeyError, TypeError) as error:
        raise ParseError(f"unreadable PDF: {error}") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise ParseError("PDF has no extractable text (scanned images?)")
    return ParsedDocument(title=str(title), text=text, kind="pdf", metadata={"pages": str(len(pages))})


def _message_body(message: email.message.EmailMessage) -> str:
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return ""
    content = part.get_content()
    if part.get_content_type() == "text/html":
        import trafilatura

        content = trafilatura.extract(content) or ""
    return content.strip()


def _email_document(message: email.message.EmailMessage, part: str) -> ParsedDocument:
    subject = str(message.get("subject", "")).strip() or "(no subject)"
    headers = {key: str(message.get(key, "")) for key in ("from", "to", "date", "message-id") if message.get(key)}
    body = _message_body(message)
    if not body:
        raise ParseError(f"e-mail {part or ''} has no text body".replace("  ", " "))
    header_text = "\n".join(f"{k.title()}: {v}" for k, v in headers.items() if k != "message-id")
    return ParsedDocument(title=subject, text=f"Subject: {subject}\n{header_text}\n\n{body}", kind="email", part=part, metadata=headers)


def parse_eml(data: bytes) -> ParsedDocument:
    message = email.message_from_bytes(data, policy=email.policy.default)
    if not message.keys():
        raise ParseError("not an e-mail message (no headers)")
    return _email_document(message, "")


def parse_mbox(data: bytes) -> list[ParsedDocument]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "box.mbox"
        path.write_bytes(data)
        box = mailbox.mbox(path, factory=lambda f: email.message_from_binary_file(f, policy=email.policy.default))
        documents = []
        for index, message in enumerate(box):
            try:
                documents.append(_email_document(message, f"msg{index}"))
            except ParseError:
                continue  # an empty message inside a mailbox is not a broken mailbox
        box.close()
    if not documents:
        raise ParseError("mbox holds no messages with a text body")
    return documents


def detect_kind(name: str, media_type: str | None) -> str:
    media = (media_type or "").split(";")[0].strip().lower()
    suffix = PurePosixPath(name).suffix.lower()
    if media in {"text/html", "application/xhtml+xml"} or suffix in HTML_SUFFIXES:
        return "html"
    if media == "application/pdf" or suffix == ".pdf":
        return "pdf"
    if media == "message/rfc822" or suffix == ".eml":
        return "eml"
    if media == "application/mbox" or suffix == ".mbox":
        return "mbox"
    if suffix in MARKDOWN_SUFFIXES or media == "text/markdown":
        return "markdown"
    if suffix in CODE_SUFFIXES:
        return "code"
    if suffix in TEXT_SUFFIXES or media.startswith("text/") or PurePosixPath(name).name in TEXT_FILENAMES:
        return "text"
    return "unknown"


def parse_bytes(data: bytes, name: str, media_type: str | None = None, title: str | None = None) -> list[ParsedDocument]:
    """Parse one fetched item into one or more documents, or raise ParseError naming why."""
    fallback = title or _stem_title(name)
    kind = detect_kind(name, media_type)
    if not data.strip():
        raise ParseError("empty file")
    if kind == "html":
        return [parse_html(data, fallback)]
    if kind == "pdf":
        return [parse_pdf(data, fallback)]
    if kind == "eml":
        return [parse_eml(data)]
    if kind == "mbox":
        return parse_mbox(data)
    if kind == "unknown":
        # Unknown suffix: accept only if it decodes as clean text, otherwise it is binary.
        text = _decode_text(data)
        return [ParsedDocument(title=fallback, text=text, kind="text")]
    text = _decode_text(data)
    if kind == "markdown":
        return [ParsedDocument(title=_markdown_title(text, fallback), text=text, kind="markdown")]
    return [ParsedDocument(title=fallback, text=text, kind=kind)]
