//! The git server's request parsing and answers.

use super::*;

#[test]
fn basic_credentials_are_decoded() {
    // "alice:s3cret:with:colons"
    assert_eq!(
        parse_basic("Basic YWxpY2U6czNjcmV0OndpdGg6Y29sb25z"),
        Some(("alice".into(), "s3cret:with:colons".into()))
    );
    assert_eq!(parse_basic("Bearer abc"), None);
    assert_eq!(parse_basic("Basic !!!"), None);
}

#[test]
fn chunked_bodies_are_decoded_and_bounded() {
    let head = Head {
        method: "POST".into(),
        target: "/x".into(),
        headers: vec![("transfer-encoding".into(), "chunked".into())],
    };
    let raw = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n";
    let body = read_body(&mut &raw[..], &head, 100).unwrap();
    assert_eq!(body, b"hello world");
    let err = read_body(&mut &raw[..], &head, 8).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
    let bad = b"zz\r\nhello\r\n0\r\n\r\n";
    assert!(read_body(&mut &bad[..], &head, 100).is_err());
}
