//! Masking secret values in what upstream answers: each occurrence becomes as many `*`, so
//! lengths (and a `Content-Length`) stay true. Not only the bytes themselves: a server may
//! echo a value percent-encoded, Base64-encoded (inside a longer encoding too, so at each of
//! the three alignments), JSON-escaped or hex-encoded, so each of those forms is masked as
//! well ([`needles`]), in any mix of ASCII upper and lower case (hex and percent escapes
//! read the same in either; a header's name reaches the command in lower case). A body is masked as it streams: the end of each piece that could begin a
//! form is held back until the next piece shows whether it does. Trailers are dropped: they
//! come after the body, where nothing could be masked in time. A compressed body is
//! inflated first ([`Inflated`]), since masking needs the bytes as they will be read.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};

/// Shortest encoded form masked: shorter ones would mask ordinary text.
const MIN_FORM: usize = 6;

/// Every form of each value to mask: the bytes, percent-encoded (`+` or `%20` for a space),
/// the middle of its Base64 encoding at each alignment (standard and URL-safe alphabets),
/// JSON-escaped (with `/` escaped and not), and hex. The [`Finder`] matches them in any case.
pub fn needles(values: &[Vec<u8>]) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    let mut out: Vec<Vec<u8>> = Vec::new();
    for v in values.iter().filter(|v| !v.is_empty()) {
        out.push(v.clone());
        let plus: String = form_urlencoded::byte_serialize(v).collect();
        let mut forms = vec![
            plus.replace('+', "%20"),
            lower_escapes(&plus),
            lower_escapes(&plus.replace('+', "%20")),
            plus,
        ];
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            for k in 0..3usize {
                let mut b = vec![0u8; k];
                b.extend_from_slice(v);
                let enc = engine.encode(&b);
                // The characters that depend on the value alone.
                let (skip, end) = ((8 * k).div_ceil(6), (8 * b.len()) / 6);
                if end > skip {
                    forms.push(enc[skip..end].to_string());
                }
            }
        }
        forms.push(v.iter().map(|b| format!("{b:02x}")).collect());
        if let Ok(text) = std::str::from_utf8(v) {
            let json = serde_json::to_string(text).expect("strings serialise");
            let json = &json[1..json.len() - 1];
            forms.push(json.replace('/', "\\/"));
            forms.push(json.to_string());
        }
        out.extend(
            forms
                .into_iter()
                .filter(|f| f.len() >= MIN_FORM.min(v.len()))
                .map(String::into_bytes),
        );
    }
    out.sort();
    out.dedup();
    out
}

/// `s` with the hex digits of its `%XX` escapes in lower case.
fn lower_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut left = 0;
    for c in s.chars() {
        if c == '%' {
            left = 2;
            out.push(c);
        } else if left > 0 {
            left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// One automaton for every form of every value, built once per answer: a piece is scanned
/// once, however many forms there are, and the status line, the headers and the body share
/// it. It matches in any ASCII case: masking a little more than needed, never less.
#[derive(Clone)]
pub struct Finder {
    automaton: Option<aho_corasick::AhoCorasick>,
    /// The longest form's length less one: what a body must hold back across pieces.
    keep: usize,
}

impl Finder {
    pub fn new(values: &[Vec<u8>]) -> Self {
        let keep = values.iter().map(|v| v.len()).max().unwrap_or(1).max(1) - 1;
        let values: Vec<&Vec<u8>> = values.iter().filter(|v| !v.is_empty()).collect();
        let automaton = (!values.is_empty()).then(|| {
            aho_corasick::AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(values)
                .expect("byte patterns always build")
        });
        Self { automaton, keep }
    }

    /// Whether there is anything to look for.
    pub fn any(&self) -> bool {
        self.automaton.is_some()
    }

    /// The longest form's length less one.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Whether `data` holds a form of a value.
    pub fn found(&self, data: &[u8]) -> bool {
        self.automaton.as_ref().is_some_and(|a| a.is_match(data))
    }

    /// `data` masked, or None when nothing in it needs masking (and nothing is copied).
    pub fn masked(&self, data: &[u8]) -> Option<Vec<u8>> {
        let a = self.automaton.as_ref().filter(|a| a.is_match(data))?;
        let mut out = data.to_vec();
        in_place(&mut out, a);
        Some(out)
    }
}

/// `data` with every occurrence of each of `values` masked.
#[cfg(test)]
fn all(data: &[u8], values: &[Vec<u8>]) -> Vec<u8> {
    Finder::new(values)
        .masked(data)
        .unwrap_or_else(|| data.to_vec())
}

/// Masks every occurrence, overlapping ones too (two forms can share bytes).
fn in_place(data: &mut [u8], finder: &aho_corasick::AhoCorasick) {
    let found: Vec<std::ops::Range<usize>> = finder
        .find_overlapping_iter(&*data)
        .map(|m| m.range())
        .collect();
    for r in found {
        data[r].fill(b'*');
    }
}

/// A response body with the values masked.
pub struct Masked<B> {
    inner: B,
    finder: Option<aho_corasick::AhoCorasick>,
    /// What has come and not gone out: masked, its last `keep` bytes held back.
    held: BytesMut,
    keep: usize,
    done: bool,
}

impl<B> Masked<B> {
    pub fn new(inner: B, finder: Finder) -> Self {
        Self {
            inner,
            keep: finder.keep,
            finder: finder.automaton,
            held: BytesMut::new(),
            done: false,
        }
    }
}

impl<B> Body for Masked<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
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
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.held.extend_from_slice(&data);
                        if let Some(f) = &this.finder {
                            in_place(&mut this.held, f);
                        }
                        let emit = this.held.len().saturating_sub(this.keep);
                        if emit == 0 {
                            continue;
                        }
                        let out = this.held.split_to(emit).freeze();
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    // Trailers: dropped (see the module's doc).
                    Err(_) => continue,
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
        let masked = Masked::new(body, Finder::new(&[b"tok-SECRET-123".to_vec()]));
        let out = masked.collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "echo: ************** and ************** end"
        );
        assert_eq!(all(b"xx-ab-xx", &[b"ab".to_vec()]), b"xx-**-xx");
    }

    #[test]
    fn every_encoded_form_is_masked() {
        use base64::Engine as _;
        let v = "Tok/en\"+ x=1&y".to_string();
        let n = needles(&[v.clone().into_bytes()]);
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        let pct: String = form_urlencoded::byte_serialize(v.as_bytes()).collect();
        for text in [
            format!("a={pct}&"),
            format!("a={}&", lower_escapes(&pct)),
            format!("a={}&", pct.replace('+', "%20")),
            b64(v.clone()),
            b64(format!("u:{v}")),
            b64(format!("us:{v}")),
            serde_json::json!({ "t": v }).to_string(),
            serde_json::json!({ "t": v })
                .to_string()
                .replace('/', "\\/"),
            hex(&v),
            hex(&v).to_uppercase(),
            format!("x-{}", hex(&v)).to_ascii_lowercase(),
            b64(v.clone()).to_ascii_lowercase(),
        ] {
            let masked = all(text.as_bytes(), &n);
            assert_ne!(masked, text.as_bytes(), "{text}");
            // What was masked is the value's form, not its surroundings.
            assert!(masked.iter().filter(|b| **b == b'*').count() >= 6, "{text}");
        }
        // The letters of a value keep their case in its escaped form.
        assert!(n.iter().any(|f| f.starts_with(b"Tok%2Fen")));
        // Text that holds no form of it is left alone.
        assert_eq!(all(b"Tok/e and 546f6b2f", &n), b"Tok/e and 546f6b2f");
    }

    fn hex(v: &str) -> String {
        v.bytes().map(|b| format!("{b:02x}")).collect()
    }
}
