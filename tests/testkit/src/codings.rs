//! Content codings as a provider that compresses applies them, and every
//! way a plugin could undo them: for tests that a compressed echo of a
//! secret never reaches anything the host hands on.

use std::io::{Read, Write};

/// The codings tests run through (RFC 9110's and the two in common use).
pub const ALL: [&str; 4] = ["gzip", "deflate", "br", "zstd"];

/// `plain` under `coding` (an unknown coding leaves it as it is).
pub fn encode(coding: &str, plain: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
            w.write_all(plain).unwrap();
            drop(w);
            out
        }
        "zstd" => zstd::encode_all(plain, 3).unwrap(),
        _ => plain.to_vec(),
    }
}

/// Every reading of `bytes`: as they are, and decoded under each coding
/// that decodes them.
pub fn every_decoding(bytes: &[u8]) -> Vec<Vec<u8>> {
    fn read(mut r: impl Read) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        r.read_to_end(&mut v).ok().map(|_| v)
    }
    let mut out = vec![bytes.to_vec()];
    out.extend(read(flate2::read::MultiGzDecoder::new(bytes)));
    out.extend(read(flate2::read::ZlibDecoder::new(bytes)));
    out.extend(read(flate2::read::DeflateDecoder::new(bytes)));
    out.extend(read(brotli::Decompressor::new(bytes, 4096)));
    out.extend(zstd::decode_all(bytes).ok());
    out
}

/// Whether any reading of `bytes` holds `needle`.
pub fn holds(bytes: &[u8], needle: &[u8]) -> bool {
    every_decoding(bytes).iter().any(|r| r.windows(needle.len().max(1)).any(|w| w == needle))
}
