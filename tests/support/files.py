"""Real files of every supported kind, built byte by byte for tests (no fixtures downloaded)."""

from __future__ import annotations


def make_pdf(text: str, title: str = "Test PDF") -> bytes:
    """A minimal but valid one-page PDF with a text layer and a correct xref table."""
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Title ({title}) >>".encode(),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def make_eml(subject: str, body: str, sender: str = "ann@example.com") -> bytes:
    return (
        f"From: {sender}\r\nTo: bob@example.com\r\nSubject: {subject}\r\nDate: Mon, 2 Mar 2026 10:00:00 +0000\r\n"
        f"Message-ID: <{abs(hash(subject))}@example.com>\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    ).encode()


def make_mbox(messages: list[tuple[str, str]]) -> bytes:
    parts = []
    for subject, body in messages:
        parts.append(b"From ann@example.com Mon Mar  2 10:00:00 2026\n" + make_eml(subject, body).replace(b"\r\n", b"\n"))
    return b"\n".join(parts)
