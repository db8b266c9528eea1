//! thumbor's URL grammar on an image route, over real sockets: sources from `root`, `/unsafe/`
//! URLs, fit-in with format and quality filters, and thumbor's HMAC-SHA1 signatures (computed
//! by Python's hmac and base64, as libthumbor does) accepted, unsigned and tampered URLs 403.

mod common;

use std::path::Path;

use common::{one_route, pip, Got, Larder, PIP_PACKAGES};
use larder::images::sniff;

const KEY: &str = "my-thumbor-key";

/// larder with one image route whose originals are under `root` (holding the bench photo as
/// `photo.jpg`), `keys` more lines of the route's `images` table.
async fn start(root: &Path, keys: &str) -> Larder {
    let store = root.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let photo = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/data/photo-640x856.jpg");
    std::fs::copy(photo, root.join("photo.jpg")).unwrap();
    let images = format!(
        "dir = \"{}\"\nroot = \"{}\"\n{keys}",
        store.display(),
        root.display()
    );
    Larder::start(&one_route("", "images", &images)).await
}

async fn get(larder: &Larder, path: &str) -> Got {
    common::get(&common::client(), &larder.url(path), &[]).await
}

/// libthumbor's signature of `path` (what follows the hash) with `key`, by Python.
fn python_signature(key: &str, path: &str) -> String {
    let python = pip(PIP_PACKAGES);
    let script = "import base64, hashlib, hmac, sys\n\
                  print(base64.urlsafe_b64encode(hmac.new(sys.argv[1].encode(), \
                  sys.argv[2].encode(), hashlib.sha1).digest()).decode())";
    let out = std::process::Command::new(python)
        .args(["-c", script, key, path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn unsafe_urls_resize_crop_and_convert() {
    let root = tempfile::tempdir().unwrap();
    let larder = start(root.path(), "").await;

    let r = get(&larder, "/unsafe/100x100/smart/photo.jpg").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = sniff::probe(&r.body).unwrap();
    assert_eq!(p.format.name(), "jpeg");
    assert_eq!((p.width, p.height), (100, 100));

    let r = get(
        &larder,
        "/unsafe/fit-in/100x100/filters:format(webp):quality(50)/photo.jpg",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = sniff::probe(&r.body).unwrap();
    assert_eq!(p.format.name(), "webp");
    // 640x856 fitted in 100x100: 75x100
    assert!(
        p.width <= 100 && p.height == 100,
        "{}x{}",
        p.width,
        p.height
    );

    // a malformed filter: 400 naming it
    let r = get(&larder, "/unsafe/100x100/filters:quality(x)/photo.jpg").await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("quality"), "{}", r.text());
}

#[tokio::test]
async fn signed_urls_are_checked_before_any_work() {
    let root = tempfile::tempdir().unwrap();
    let larder = start(root.path(), &format!("thumbor = {{ key = \"{KEY}\" }}")).await;

    let path = "100x100/smart/photo.jpg";
    let sig = python_signature(KEY, path);
    assert_eq!(sig.len(), 28);
    let r = get(&larder, &format!("/{sig}/{path}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = sniff::probe(&r.body).unwrap();
    assert_eq!((p.width, p.height), (100, 100));

    // unsigned, tampered, signed with another key: 403, even for an image that does not exist
    for url in [
        format!("/unsafe/{path}"),
        format!("/{sig}/100x101/smart/photo.jpg"),
        format!("/{}/{path}", python_signature("another-key", path)),
        format!("/{sig}/100x100/smart/missing.jpg"),
    ] {
        let r = get(&larder, &url).await;
        assert_eq!(r.status, 403, "{url}: {}", r.text());
    }
}
