//! A body that is itself a compressed file, sent without `Content-Encoding` (a `.gz` served
//! as `application/gzip`, a zlib stream): the command gets its bytes as they came (a
//! package's checksum must still hold), but the brain inflates a copy as it streams and
//! looks for the values there (in the gzip header's name, comment and extra fields too). A
//! compressed piece goes out only once what it inflates to, and a needle's length past it,
//! has been looked at; when a value turns up, the answer is cut off there (it cannot be
//! masked inside compressed bytes without changing them) and `on_found` is told. A stream
//! that turns out not to inflate goes on as it is. Only the outer layer is read: a
//! compressed file inside a compressed file is not.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};

use super::inflate::{Coding, Stream};
use super::mask::Finder;

/// Compressed bytes held back at most while their inflated bytes are looked at.
const MAX_HELD: usize = 256 * 1024;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body whose compressed copy is looked into.
pub struct Watched<B> {
    inner: B,
    finder: Finder,
    /// Told (in words) when a value is found.
    on_found: Arc<dyn Fn(String) + Send + Sync>,
    /// What the stream was found to be: undecided until two bytes came.
    stream: Option<Stream>,
    decided: bool,
    /// The first bytes, while undecided.
    start: BytesMut,
    /// Compressed bytes come and not yet fed to the copy.
    pending: Bytes,
    /// Fed and not yet sent, each with the inflated total after it.
    held: VecDeque<(Bytes, u64)>,
    held_bytes: usize,
    /// Inflated bytes looked at, and the last of them (a needle may straddle two steps).
    inflated: u64,
    tail: Vec<u8>,
    /// The gzip header fields' length when last looked at.
    header_seen: usize,
    done: bool,
}

impl<B> Watched<B> {
    pub fn new(inner: B, finder: Finder, on_found: Arc<dyn Fn(String) + Send + Sync>) -> Self {
        Self {
            inner,
            finder,
            on_found,
            stream: None,
            decided: false,
            start: BytesMut::new(),
            pending: Bytes::new(),
            held: VecDeque::new(),
            held_bytes: 0,
            inflated: 0,
            tail: Vec::new(),
            header_seen: 0,
            done: false,
        }
    }

    /// Whether the oldest held piece may go: not reading a copy, or enough looked at past it.
    fn releasable(&self) -> bool {
        match self.held.front() {
            None => false,
            Some((_, at)) => {
                self.stream.is_none() || self.inflated > at + self.finder.keep() as u64
            }
        }
    }

    fn cut(&self, why: &str) -> BoxError {
        (self.on_found)(format!(
            "the answer is a compressed file (without Content-Encoding) that holds the secret's value {why}; the brain cannot mask it inside compressed bytes, so the answer was cut off there"
        ));
        Box::new(std::io::Error::other(
            "tether egress: the answer was cut off: it holds the secret's value in compressed form",
        ))
    }

    /// Looks at `out`, just inflated, with the tail before it.
    fn look(&mut self, out: &[u8]) -> Result<(), BoxError> {
        if out.is_empty() {
            return Ok(());
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(out);
        if self.finder.found(&window) {
            return Err(self.cut("in its contents"));
        }
        let keep = self.finder.keep().min(window.len());
        self.tail = window.split_off(window.len() - keep);
        self.inflated += out.len() as u64;
        Ok(())
    }

    /// Stops reading a copy: what is held goes out as it is.
    fn plain(&mut self) {
        self.stream = None;
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() {
            self.held.push_back((rest, 0));
        }
    }

    /// One step of the copy: feeds the next compressed bytes and looks at what they gave.
    fn step(&mut self) -> Result<(), BoxError> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let (took, out) = match stream.step(&self.pending) {
            Ok(r) => r,
            Err(_) => {
                // Not a stream after all (or a broken one): nobody can read a value from it.
                self.plain();
                return Ok(());
            }
        };
        let fields = stream.header_fields();
        let ended = stream.ended;
        if fields.len() != self.header_seen {
            self.header_seen = fields.len();
            if self.finder.found(&fields) {
                return Err(self.cut("in its gzip header"));
            }
        }
        let piece = self.pending.split_to(took);
        self.look(&out)?;
        if !piece.is_empty() {
            self.held_bytes += piece.len();
            self.held.push_back((piece, self.inflated));
        }
        if ended {
            // What follows the stream's end no reader inflates.
            self.plain();
        }
        if self.held_bytes > MAX_HELD {
            return Err(self.cut_long());
        }
        Ok(())
    }

    fn cut_long(&self) -> BoxError {
        (self.on_found)(format!(
            "the answer is a compressed file whose next {} KiB inflate to too little to look at; the brain cannot tell whether it holds the secret's value, so the answer was cut off there",
            MAX_HELD / 1024
        ));
        Box::new(std::io::Error::other(
            "tether egress: the answer was cut off: its compressed bytes could not be looked into",
        ))
    }

    /// The stream's first bytes came: a compressed stream is read, anything else passes.
    fn decide(&mut self) {
        self.decided = true;
        let start = self.start.split().freeze();
        match Coding::sniff(&start) {
            Some(c) if self.finder.any() => {
                self.stream = Some(Stream::new(c));
                self.pending = start;
            }
            _ => self.held.push_back((start, 0)),
        }
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if this.releasable() {
                let (piece, _) = this.held.pop_front().expect("checked");
                this.held_bytes = this.held_bytes.saturating_sub(piece.len());
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            if this.stream.is_some() && !this.pending.is_empty() {
                this.step()?;
                continue;
            }
            if this.done {
                if let Some(mut stream) = this.stream.take() {
                    // The end: what the copy still holds is looked at, then all goes.
                    if let Ok(out) = stream.finish() {
                        this.look(&out)?;
                    }
                    this.plain();
                    continue;
                }
                if this.held.is_empty() {
                    return Poll::Ready(None);
                }
                continue;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    if !this.decided {
                        this.decide();
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(mut data) = frame.into_data() else {
                        continue;
                    };
                    if !this.decided {
                        let need = 2 - this.start.len();
                        let n = need.min(data.len());
                        this.start.extend_from_slice(&data[..n]);
                        data.advance(n);
                        if this.start.len() < 2 {
                            continue;
                        }
                        this.decide();
                    }
                    if data.is_empty() {
                        continue;
                    }
                    if this.stream.is_some() {
                        let mut p = BytesMut::from(std::mem::take(&mut this.pending));
                        p.extend_from_slice(&data);
                        this.pending = p.freeze();
                    } else {
                        this.held.push_back((data, 0));
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        // The bytes are passed as they came.
        let mut h = self.inner.size_hint();
        let held = (self.held_bytes + self.pending.len() + self.start.len()) as u64;
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
    use shared::locks::Lock;
    use std::io::Write as _;
    use std::sync::Mutex;

    fn gzip(parts: &[&[u8]], name: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            let mut b = flate2::GzBuilder::new();
            if let Some(n) = name {
                b = b.filename(n);
            }
            let mut gz = b.write(Vec::new(), flate2::Compression::default());
            gz.write_all(p).unwrap();
            out.extend(gz.finish().unwrap());
        }
        out
    }

    async fn through(data: Vec<u8>, pieces: usize) -> (Result<Vec<u8>, String>, Vec<String>) {
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let size = data.len().div_ceil(pieces).max(1);
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = data
            .chunks(size)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let finder = Finder::new(&super::super::mask::needles(&[b"s3cr3t-value".to_vec()]));
        let mut w = Watched::new(body, finder, Arc::new(move |why| t.locked().push(why)));
        let mut out = Vec::new();
        let mut result = Ok(());
        while let Some(f) = w.frame().await {
            match f {
                Ok(f) => out.extend(f.into_data().unwrap()),
                Err(e) => {
                    result = Err(e.to_string());
                    break;
                }
            }
        }
        let told = told.locked().clone();
        (result.map(|_| out), told)
    }

    /// What a reader gets out of the bytes that went out (as much as inflates).
    fn readable(got: &[u8]) -> Vec<u8> {
        let mut d = flate2::write::MultiGzDecoder::new(Vec::new());
        let _ = d.write_all(got);
        let _ = d.flush();
        d.get_ref().clone()
    }

    #[tokio::test]
    async fn a_compressed_file_without_the_value_passes_byte_for_byte() {
        let file = gzip(&[&b"a plain tarball ".repeat(50_000)], Some(b"pkg.tar"));
        for pieces in [1, 7, 1000] {
            let (got, told) = through(file.clone(), pieces).await;
            assert_eq!(got.unwrap(), file, "{pieces}");
            assert!(told.is_empty());
        }
        let text = b"x^ is not a zlib stream, it only begins like one".to_vec();
        assert_eq!(through(text.clone(), 3).await.0.unwrap(), text);
    }

    #[tokio::test]
    async fn the_value_in_a_compressed_file_cuts_it_off_before_any_of_it_can_be_read() {
        let filler = b"filler text that compresses ".repeat(20_000);
        for (file, place) in [
            (gzip(&[b"token=s3cr3t-value"], None), "contents"),
            (
                gzip(&[&filler, b"token=s3cr3t-value", &filler], None),
                "contents",
            ),
            (gzip(&[b"first", b"then s3cr3t-value"], None), "contents"),
            (gzip(&[b"x"], Some(b"s3cr3t-value.txt")), "gzip header"),
            (
                gzip(
                    &[
                        &filler,
                        &hex_of(b"s3cr3t-value").to_uppercase().into_bytes(),
                    ],
                    None,
                ),
                "contents",
            ),
            (
                {
                    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), Default::default());
                    z.write_all(b"token=s3cr3t-value").unwrap();
                    z.finish().unwrap()
                },
                "contents",
            ),
        ] {
            for pieces in [1, 5, 333] {
                let (got, told) = through(file.clone(), pieces).await;
                assert!(got.is_err(), "{place} {pieces}");
                assert!(told[0].contains(place), "{told:?}");
            }
        }
        // What went out before the cut does not hold the value.
        let file = gzip(&[&filler, b"token=s3cr3t-value"], None);
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = file
            .chunks(97)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let finder = Finder::new(&super::super::mask::needles(&[b"s3cr3t-value".to_vec()]));
        let mut w = Watched::new(body, finder, Arc::new(move |why| t.locked().push(why)));
        let mut sent = Vec::new();
        while let Some(Ok(f)) = w.frame().await {
            sent.extend(f.into_data().unwrap());
        }
        let read = readable(&sent);
        assert!(read.len() > 100_000, "{}", read.len());
        assert!(
            !read.windows(6).any(|w| w == b"s3cr3t"),
            "a piece of it went out"
        );
    }

    fn hex_of(v: &[u8]) -> String {
        v.iter().map(|b| format!("{b:02x}")).collect()
    }
}
