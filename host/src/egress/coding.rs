//! Content codings of a provider's answer (RFC 9110 §8.4): what the host
//! undoes before it looks for a secret in a body.
//!
//! A request that carries a credential asks for `identity`; a provider may
//! still compress. Scrubbing searches bytes, and a compressed echo of the
//! secret shares none with it, so such an answer is decoded first, within
//! the same size limit as any answer (counted on the decoded bytes, so a
//! small bomb cannot grow past it). A coding the host does not know is
//! refused by name rather than handed on unscrubbed.

use std::io::Read;

/// Why an encoded body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CodingError {
    #[error("the answer is encoded as {0:?}, which the host cannot decode to scrub it")]
    Unknown(String),
    #[error("the answer claims coding {0:?} but does not decode as it")]
    Corrupt(String),
    #[error("the decoded answer exceeds the response size limit")]
    TooLarge,
}

/// The codings a `Content-Encoding` value lists, in the order they were
/// applied, without `identity` (which changes nothing).
pub(crate) fn codings(content_encoding: &str) -> Vec<String> {
    content_encoding
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .filter(|c| !c.is_empty() && c != "identity")
        .collect()
}

/// `body` with every coding of `content_encoding` undone (the last
/// applied first), at most `limit` bytes after each step.
pub(crate) fn decode(content_encoding: &str, body: &[u8], limit: usize) -> Result<Vec<u8>, CodingError> {
    let mut current = body.to_vec();
    for coding in codings(content_encoding).iter().rev() {
        current = decode_one(coding, &current, limit)?;
    }
    Ok(current)
}

/// The codings [`encode`] applies and [`decode`] undoes.
pub(crate) const KNOWN: [&str; 4] = ["gzip", "deflate", "br", "zstd"];

/// `body` under `coding` (one of [`KNOWN`]), as a provider that
/// compresses would send it; `None` for another coding. The conformance
/// suite compresses recorded answers with it.
pub(crate) fn encode(coding: &str, body: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    let level = flate2::Compression::default();
    match coding {
        "gzip" => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), level);
            w.write_all(body).ok()?;
            w.finish().ok()
        }
        "deflate" => {
            let mut w = flate2::write::ZlibEncoder::new(Vec::new(), level);
            w.write_all(body).ok()?;
            w.finish().ok()
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                w.write_all(body).ok()?;
            }
            Some(out)
        }
        "zstd" => zstd::stream::encode_all(body, 3).ok(),
        _ => None,
    }
}

fn decode_one(coding: &str, body: &[u8], limit: usize) -> Result<Vec<u8>, CodingError> {
    let corrupt = || CodingError::Corrupt(coding.to_owned());
    match coding {
        "gzip" | "x-gzip" => {
            bounded(flate2::read::MultiGzDecoder::new(body), limit).map_err(|e| e.unwrap_or_else(corrupt))
        }
        // `deflate` is the zlib format (RFC 9110 §8.4.1.2); servers that
        // send raw deflate instead are common enough to accept both.
        "deflate" => bounded(flate2::read::ZlibDecoder::new(body), limit)
            .or_else(|e| match e {
                Some(CodingError::TooLarge) => Err(e),
                _ => bounded(flate2::read::DeflateDecoder::new(body), limit),
            })
            .map_err(|e| e.unwrap_or_else(corrupt)),
        "br" => bounded(brotli::Decompressor::new(body, 8192), limit).map_err(|e| e.unwrap_or_else(corrupt)),
        "zstd" => {
            let decoder = zstd::stream::read::Decoder::new(body).map_err(|_| corrupt())?;
            bounded(decoder, limit).map_err(|e| e.unwrap_or_else(corrupt))
        }
        other => Err(CodingError::Unknown(other.to_owned())),
    }
}

/// Reads `reader` to its end, failing once more than `limit` bytes came.
/// `None` is a read error (the caller names the coding).
fn bounded(reader: impl Read, limit: usize) -> Result<Vec<u8>, Option<CodingError>> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(cap).read_to_end(&mut out).map_err(|_| None)?;
    if out.len() > limit {
        return Err(Some(CodingError::TooLarge));
    }
    Ok(out)
}

/// Every reading of `body` a search for a secret should cover: the bytes
/// themselves, and what they decode to under any coding they look like
/// (by their magic bytes) or that `content_encoding` names. For a check
/// over files whose headers may be lost or wrong; a decode that fails is
/// simply not a reading.
pub(crate) fn readings(body: &[u8], content_encoding: Option<&str>, limit: usize) -> Vec<Vec<u8>> {
    let mut out = vec![body.to_vec()];
    if let Some(named) = content_encoding
        && let Ok(decoded) = decode(named, body, limit)
    {
        out.push(decoded);
    }
    let mut guesses: Vec<&str> = Vec::new();
    if body.starts_with(&[0x1f, 0x8b]) {
        guesses.push("gzip");
    }
    if body.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        guesses.push("zstd");
    }
    if body.len() >= 2 && body[0] & 0x0f == 8 && (u16::from(body[0]) << 8 | u16::from(body[1])) % 31 == 0 {
        guesses.push("deflate");
    }
    // Brotli has no magic bytes: any body that is not text is tried.
    if std::str::from_utf8(body).is_err() {
        guesses.push("br");
        guesses.push("deflate");
    }
    for coding in guesses {
        if let Ok(decoded) = decode_one(coding, body, limit)
            && !out.contains(&decoded)
        {
            out.push(decoded);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const TEXT: &[u8] = b"{\"authorization\":\"Bearer canary-0123456789\"}";

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    fn zlib(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    fn br(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
            w.write_all(b).unwrap();
        }
        out
    }

    #[test]
    fn every_coding_decodes_and_stacked_codings_unwind_in_reverse() {
        assert_eq!(decode("gzip", &gzip(TEXT), 1024).unwrap(), TEXT);
        assert_eq!(decode("x-gzip", &gzip(TEXT), 1024).unwrap(), TEXT);
        assert_eq!(decode("deflate", &zlib(TEXT), 1024).unwrap(), TEXT);
        assert_eq!(decode("deflate", &raw_deflate(TEXT), 1024).unwrap(), TEXT);
        assert_eq!(decode("br", &br(TEXT), 1024).unwrap(), TEXT);
        assert_eq!(decode("zstd", &zstd::encode_all(TEXT, 3).unwrap(), 1024).unwrap(), TEXT);
        assert_eq!(decode("Identity", TEXT, 1024).unwrap(), TEXT);
        // gzip applied first, then br: br comes off first.
        assert_eq!(decode("gzip, br", &br(&gzip(TEXT)), 1024).unwrap(), TEXT);
    }

    #[test]
    fn a_bomb_stops_at_the_limit_and_unknown_or_broken_codings_are_named() {
        let bomb = gzip(&vec![b'a'; 1 << 20]);
        assert!(bomb.len() < 4096);
        assert_eq!(decode("gzip", &bomb, 64 * 1024), Err(CodingError::TooLarge));
        assert_eq!(decode("deflate", &zlib(&vec![b'a'; 1 << 20]), 1024), Err(CodingError::TooLarge));
        assert_eq!(decode("compress", TEXT, 1024), Err(CodingError::Unknown("compress".into())));
        assert_eq!(decode("gzip", TEXT, 1024), Err(CodingError::Corrupt("gzip".into())));
    }

    #[test]
    fn readings_find_a_coded_body_without_its_header() {
        for coded in [gzip(TEXT), zlib(TEXT), raw_deflate(TEXT), br(TEXT), zstd::encode_all(TEXT, 3).unwrap()] {
            assert!(readings(&coded, None, 1024).iter().any(|r| r == TEXT), "{coded:?}");
        }
        assert_eq!(readings(TEXT, None, 1024), vec![TEXT.to_vec()]);
    }
}
