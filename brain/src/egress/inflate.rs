//! A response body that came compressed though the brain asked for `identity`: inflated as
//! it streams (gzip, every member of it, or zlib for `deflate`), so the masking after it sees
//! the bytes the command will read. Memory stays small whatever the ratio: the compressed
//! bytes wait as they came, and each step feeds the decoder only what yields at most about
//! 64 KiB ([`Stream::step`]), which goes out before the next step; a stream that swallows
//! [`MAX_STARVED`] bytes without yielding any (a gzip header that never ends) is refused.

use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};

/// Compressed bytes offered to the decoder in one step (it may take fewer).
const FEED: usize = 16 * 1024;
/// Compressed bytes a stream may take without yielding a byte.
pub const MAX_STARVED: usize = 64 * 1024;

/// The codings the brain can inflate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Deflate,
}

impl Coding {
    /// A `Content-Encoding` value: `None` for identity, `Some(Ok(coding))` for one the brain
    /// inflates, `Some(Err(()))` for any other (or several).
    pub fn of(header: &str) -> Option<Result<Self, ()>> {
        match header.trim().to_ascii_lowercase().as_str() {
            "" | "identity" => None,
            "gzip" | "x-gzip" => Some(Ok(Coding::Gzip)),
            "deflate" => Some(Ok(Coding::Deflate)),
            _ => Some(Err(())),
        }
    }

    /// The coding whose stream `start` (at least two bytes) begins, by its magic: gzip's
    /// `1f 8b`, or a zlib header (deflate, a window of at most 32 KiB, its check bits right).
    pub fn sniff(start: &[u8]) -> Option<Self> {
        match *start {
            [0x1f, 0x8b, ..] => Some(Coding::Gzip),
            [cmf, flg, ..] if cmf & 0x0f == 8 && cmf >> 4 <= 7 => {
                (u16::from_be_bytes([cmf, flg]) % 31 == 0).then_some(Coding::Deflate)
            }
            _ => None,
        }
    }
}

enum Decoder {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
}

/// A compressed stream being inflated a bounded step at a time.
pub struct Stream {
    decoder: Decoder,
    /// Compressed bytes taken since the last byte it yielded.
    starved: usize,
    /// The stream's end was reached: what comes after is not part of it.
    pub ended: bool,
}

/// Why a compressed stream cannot be read.
pub fn corrupt(e: std::io::Error) -> std::io::Error {
    std::io::Error::other(format!("the upstream's compressed answer is corrupt: {e}"))
}

impl Stream {
    pub fn new(coding: Coding) -> Self {
        Self {
            decoder: match coding {
                Coding::Gzip => Decoder::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
                Coding::Deflate => Decoder::Deflate(flate2::write::ZlibDecoder::new(Vec::new())),
            },
            starved: 0,
            ended: false,
        }
    }

    /// Feeds the start of `input`: how many bytes it took and what they yielded (at most
    /// the decoder's 32 KiB buffer and what a flush adds, however much they inflate to).
    pub fn step(&mut self, input: &[u8]) -> std::io::Result<(usize, Vec<u8>)> {
        let piece = &input[..input.len().min(FEED)];
        let (took, out) = match &mut self.decoder {
            Decoder::Gzip(d) => {
                let n = d.write(piece).map_err(corrupt)?;
                d.flush().map_err(corrupt)?;
                (n, std::mem::take(d.get_mut()))
            }
            Decoder::Deflate(d) => {
                let n = d.write(piece).map_err(corrupt)?;
                d.flush().map_err(corrupt)?;
                (n, std::mem::take(d.get_mut()))
            }
        };
        if took == 0 && !piece.is_empty() {
            self.ended = true;
        }
        self.starved = if out.is_empty() {
            self.starved + took
        } else {
            0
        };
        if self.starved > MAX_STARVED {
            return Err(std::io::Error::other(format!(
                "the upstream's compressed answer yields nothing for more than {} KiB",
                MAX_STARVED / 1024
            )));
        }
        Ok((took, out))
    }

    /// The end of the compressed bytes: what is left to yield.
    pub fn finish(&mut self) -> std::io::Result<Vec<u8>> {
        let early = |e: std::io::Error| {
            std::io::Error::other(format!("the upstream's compressed answer ends early: {e}"))
        };
        Ok(match &mut self.decoder {
            Decoder::Gzip(d) => {
                d.try_finish().map_err(early)?;
                std::mem::take(d.get_mut())
            }
            Decoder::Deflate(d) => {
                d.try_finish().map_err(early)?;
                std::mem::take(d.get_mut())
            }
        })
    }

    /// A gzip member's header fields (name, comment, extra), which a reader can show too.
    pub fn header_fields(&self) -> Vec<u8> {
        let Decoder::Gzip(d) = &self.decoder else {
            return Vec::new();
        };
        let Some(h) = d.header() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for f in [h.filename(), h.comment(), h.extra()].into_iter().flatten() {
            out.extend_from_slice(f);
            out.push(0);
        }
        out
    }
}

/// A body inflated as it streams.
pub struct Inflated<B> {
    inner: B,
    stream: Stream,
    /// Compressed bytes come and not yet fed.
    pending: Bytes,
    done: bool,
}

impl<B> Inflated<B> {
    pub fn new(inner: B, coding: Coding) -> Self {
        Self {
            inner,
            stream: Stream::new(coding),
            pending: Bytes::new(),
            done: false,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for Inflated<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() && !this.stream.ended {
                let (took, out) = this.stream.step(&this.pending)?;
                this.pending.advance(took);
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
                continue;
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    let out = this.stream.finish()?;
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Some(Ok(frame))) => {
                    // What follows the stream's end is not read: it never reaches the command.
                    if let Ok(data) = frame.into_data()
                        && !this.stream.ended
                    {
                        this.pending = data;
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn gzip_and_deflate_come_out_as_sent_in_small_frames() {
        let plain = "token=abc ".repeat(10_000);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(plain.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let mut zl = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zl.write_all(plain.as_bytes()).unwrap();
        let zl = zl.finish().unwrap();
        for (coding, data) in [(Coding::Gzip, gz), (Coding::Deflate, zl)] {
            let body = http_body_util::Full::new(Bytes::from(data));
            let mut inflated = Inflated::new(body, coding);
            let mut out = Vec::new();
            let mut frames = 0;
            while let Some(f) = inflated.frame().await {
                out.extend_from_slice(&f.unwrap().into_data().unwrap());
                frames += 1;
            }
            assert_eq!(out, plain.as_bytes());
            assert!(frames > 1, "{coding:?}: {frames}");
        }
        let cut = http_body_util::Full::new(Bytes::from_static(b"\x1f\x8b\x08\x00garbage"));
        assert!(Inflated::new(cut, Coding::Gzip).collect().await.is_err());
        assert_eq!(Coding::of("br"), Some(Err(())));
        assert_eq!(Coding::of("gzip, br"), Some(Err(())));
        assert_eq!(Coding::of("identity"), None);
    }

    #[tokio::test]
    async fn a_bomb_comes_out_in_steps_of_about_64_kib() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for _ in 0..64 {
            gz.write_all(&[0u8; 1 << 20]).unwrap();
        }
        let gz = gz.finish().unwrap();
        // All of it in one frame, as a fast upstream sends it.
        let mut inflated = Inflated::new(http_body_util::Full::new(Bytes::from(gz)), Coding::Gzip);
        let (mut total, mut largest) = (0usize, 0usize);
        while let Some(f) = inflated.frame().await {
            let n = f.unwrap().into_data().unwrap().len();
            total += n;
            largest = largest.max(n);
        }
        assert_eq!(total, 64 << 20);
        // The decoder's buffer and what a flush adds: about 64 KiB, never the whole.
        assert!(largest <= 80 * 1024, "{largest}");
    }

    #[tokio::test]
    async fn a_header_that_never_ends_is_refused() {
        let mut endless = vec![0x1f, 0x8b, 8, 0x08, 0, 0, 0, 0, 0, 3];
        endless.extend(std::iter::repeat_n(b'n', 200 * 1024));
        let body = http_body_util::Full::new(Bytes::from(endless));
        let err = Inflated::new(body, Coding::Gzip)
            .collect()
            .await
            .err()
            .unwrap();
        // flate2 bounds a header field itself; the brain bounds what yields nothing.
        assert!(err.to_string().contains("field too long"), "{err}");
        let mut stored = vec![0x78, 0x01];
        for _ in 0..20_000 {
            // Empty stored blocks: five bytes each that yield nothing.
            stored.extend([0x00, 0x00, 0x00, 0xff, 0xff]);
        }
        let body = http_body_util::Full::new(Bytes::from(stored));
        let err = Inflated::new(body, Coding::Deflate)
            .collect()
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("yields nothing"), "{err}");
    }

    #[test]
    fn gzip_and_zlib_are_known_by_their_magic() {
        assert_eq!(Coding::sniff(&[0x1f, 0x8b, 8]), Some(Coding::Gzip));
        for level in [0, 1, 6, 9] {
            let mut z =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(level));
            z.write_all(b"x").unwrap();
            assert_eq!(Coding::sniff(&z.finish().unwrap()), Some(Coding::Deflate));
        }
        for text in [&b"{\"a\":1}"[..], b"hello", b"<html>", b"x", b""] {
            assert_eq!(Coding::sniff(text), None, "{text:?}");
        }
    }
}
