//! Masking secret values in what upstream answers: each occurrence becomes as many `*`, so
//! lengths (and a `Content-Length`) stay true. A body is masked as it streams: the end of
//! each piece that could begin a value is held back until the next piece shows whether it
//! does.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};

/// `data` with every occurrence of each of `values` masked.
pub fn all(data: &[u8], values: &[Vec<u8>]) -> Vec<u8> {
    let mut out = data.to_vec();
    in_place(&mut out, values);
    out
}

fn in_place(data: &mut [u8], values: &[Vec<u8>]) {
    for v in values.iter().filter(|v| !v.is_empty()) {
        let finder = memchr::memmem::Finder::new(v);
        let mut i = 0;
        while let Some(at) = finder.find(&data[i..]) {
            let start = i + at;
            data[start..start + v.len()].fill(b'*');
            i = start + v.len();
        }
    }
}

/// A response body with the values masked.
pub struct Masked<B> {
    inner: B,
    values: Vec<Vec<u8>>,
    /// What has come and not gone out: masked, its last `keep` bytes held back.
    held: BytesMut,
    keep: usize,
    done: bool,
}

impl<B> Masked<B> {
    pub fn new(inner: B, values: Vec<Vec<u8>>) -> Self {
        let keep = values.iter().map(|v| v.len()).max().unwrap_or(1).max(1) - 1;
        Self {
            inner,
            values,
            held: BytesMut::new(),
            keep,
            done: false,
        }
    }
}

impl<B> Body for Masked<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    let rest = this.held.split().freeze();
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.held.extend_from_slice(&data);
                        in_place(&mut this.held, &this.values);
                        let emit = this.held.len().saturating_sub(this.keep);
                        if emit == 0 {
                            continue;
                        }
                        let out = this.held.split_to(emit).freeze();
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        // Masking keeps the length.
        let mut h = self.inner.size_hint();
        let held = self.held.len() as u64;
        h.set_lower(h.lower() + held);
        if let Some(u) = h.upper() {
            h.set_upper(u + held);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_value_cut_across_pieces_is_masked_and_the_length_kept() {
        let pieces: Vec<Result<Frame<Bytes>, std::io::Error>> = [
            "echo: tok-SEC",
            "RET-1",
            "23 and tok",
            "-SECRET-123",
            " end",
        ]
        .iter()
        .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
        .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(pieces));
        let masked = Masked::new(body, vec![b"tok-SECRET-123".to_vec()]);
        let out = masked.collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "echo: ************** and ************** end"
        );
        assert_eq!(all(b"xx-ab-xx", &[b"ab".to_vec()]), b"xx-**-xx");
    }
}
