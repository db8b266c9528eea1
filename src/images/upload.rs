//! Receiving uploads: a raw body (`Content-Type: image/jpeg`, zimg's bare `jpeg`, anything) or
//! `multipart/form-data` with one or more files (parsed by `multer`). The size limit is enforced
//! while reading: the request is cut off with 413 as soon as it passes the limit, never buffered
//! whole first. What the bytes are is decided later by sniffing, never by the declared type.

use crate::body::RequestBody;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::header::{self, HeaderMap};
use http_body_util::{BodyExt, BodyStream};

use super::ImageError;

/// Reads the uploaded files of a request body.
pub async fn files(
    headers: &HeaderMap,
    body: RequestBody,
    max: u64,
) -> Result<Vec<Bytes>, ImageError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        // A form carries a little more than its files: allow some overhead for the framing.
        let limit = max.saturating_add(64 * 1024);
        if declared.is_some_and(|n| n > limit) {
            return Err(ImageError::TooLarge(max));
        }
        return multipart(content_type, body, max, limit).await;
    }
    if declared.is_some_and(|n| n > max) {
        return Err(ImageError::TooLarge(max));
    }
    Ok(vec![raw(body, max).await?])
}

/// The whole body, refused as soon as it passes `max` bytes.
async fn raw(mut body: RequestBody, max: u64) -> Result<Bytes, ImageError> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ImageError::BadUpload(format!("reading body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > max {
                return Err(ImageError::TooLarge(max));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// Every part with a file name (or, if none has one, every part) of a form.
async fn multipart(
    content_type: &str,
    body: RequestBody,
    max_file: u64,
    max_stream: u64,
) -> Result<Vec<Bytes>, ImageError> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| ImageError::BadUpload(format!("multipart: {e}")))?;
    let stream = BodyStream::new(body).filter_map(|frame| async move {
        match frame {
            Ok(f) => f.into_data().ok().map(Ok),
            Err(e) => Some(Err(e)),
        }
    });
    let constraints = multer::Constraints::new().size_limit(
        multer::SizeLimit::new()
            .whole_stream(max_stream)
            .per_field(max_file),
    );
    let mut form = multer::Multipart::with_constraints(stream, boundary, constraints);
    let mut named = Vec::new();
    let mut unnamed = Vec::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(multer_error(e, max_file)),
        };
        let has_name = field.file_name().is_some();
        let data = field.bytes().await.map_err(|e| multer_error(e, max_file))?;
        if has_name {
            named.push(data);
        } else {
            unnamed.push(data);
        }
    }
    let files = if named.is_empty() { unnamed } else { named };
    if files.is_empty() {
        return Err(ImageError::BadUpload("the form holds no file".into()));
    }
    Ok(files)
}

fn multer_error(e: multer::Error, max: u64) -> ImageError {
    match e {
        multer::Error::FieldSizeExceeded { .. } | multer::Error::StreamSizeExceeded { .. } => {
            ImageError::TooLarge(max)
        }
        e => ImageError::BadUpload(format!("multipart: {e}")),
    }
}
