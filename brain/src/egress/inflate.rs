//! A response body that came compressed though the brain asked for `identity`: inflated as
//! it streams (gzip, or zlib for `deflate`), so the masking after it sees the bytes the
//! command will read. Each piece is fed a few KiB at a time, so a small piece that inflates
//! to a great deal comes out as many frames, never as one huge buffer.

use std::collections::VecDeque;
use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

/// Compressed bytes fed to the decoder at once.
const FEED: usize = 4 * 1024;

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
}

enum Decoder {
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Deflate(flate2::write::ZlibDecoder<Vec<u8>>),
}

impl Decoder {
    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.write_all(data),
            Decoder::Deflate(d) => d.write_all(data),
        }
    }
    fn take(&mut self) -> Vec<u8> {
        match self {
            Decoder::Gzip(d) => std::mem::take(d.get_mut()),
            Decoder::Deflate(d) => std::mem::take(d.get_mut()),
        }
    }
    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            Decoder::Gzip(d) => d.try_finish(),
            Decoder::Deflate(d) => d.try_finish(),
        }
    }
}

/// A body inflated as it streams.
pub struct Inflated<B> {
    inner: B,
    decoder: Decoder,
    ready: VecDeque<Bytes>,
    done: bool,
}

impl<B> Inflated<B> {
    pub fn new(inner: B, coding: Coding) -> Self {
        Self {
            inner,
            decoder: match coding {
                Coding::Gzip => Decoder::Gzip(flate2::write::GzDecoder::new(Vec::new())),
                Coding::Deflate => Decoder::Deflate(flate2::write::ZlibDecoder::new(Vec::new())),
            },
            ready: VecDeque::new(),
            done: false,
        }
    }

    fn feed(&mut self, data: &[u8]) -> std::io::Result<()> {
        for piece in data.chunks(FEED) {
            self.decoder.write_all(piece)?;
            let out = self.decoder.take();
            if !out.is_empty() {
                self.ready.push_back(Bytes::from(out));
            }
        }
        Ok(())
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
            if let Some(b) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    this.decoder.finish().map_err(|e| {
                        Box::new(std::io::Error::other(format!(
                            "the upstream's compressed answer ends early: {e}"
                        ))) as BoxError
                    })?;
                    let out = this.decoder.take();
                    if !out.is_empty() {
                        this.ready.push_back(Bytes::from(out));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.feed(&data).map_err(|e| {
                            Box::new(std::io::Error::other(format!(
                                "the upstream's compressed answer is corrupt: {e}"
                            ))) as BoxError
                        })?;
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
}
