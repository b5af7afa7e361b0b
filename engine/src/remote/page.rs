//! One S3 `ListObjectsV2` page as a listing reads it, with no network: the
//! page's bytes go through object_store's own parser (its quick-xml
//! deserializer) and then [`super::list`]'s key handling, exactly as a
//! listing of a real bucket would. A thin entry point for fuzzing (`fuzz/`)
//! and tests; the loader never calls it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpResponseBody, HttpService,
};
use object_store::{ClientOptions, RetryConfig};

use super::store::StoreHandle;

/// The last page of a listing: what every request after the first gets, so
/// that a page saying it is truncated ends the listing with the next one.
const LAST_PAGE: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
<ListBucketResult><IsTruncated>false</IsTruncated><KeyCount>0</KeyCount></ListBucketResult>";

/// The keys a listing of a bucket's root takes from `page` as the answer to
/// its first request (directory markers dropped, byte-wise order), or the
/// listing's error: a page that does not parse, or a key that cannot be
/// one ([`super::check_key`]).
pub fn s3_page_keys(page: &[u8]) -> Result<Vec<String>, String> {
    let connector = PageConnector {
        page: Bytes::copy_from_slice(page),
    };
    let s3 = AmazonS3Builder::new()
        .with_bucket_name("bucket")
        .with_region("us-east-1")
        .with_access_key_id("key")
        .with_secret_access_key("secret")
        .with_endpoint("http://s3.invalid")
        .with_allow_http(true)
        .with_retry(RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        })
        .with_http_connector(connector)
        .build()
        .map_err(|e| e.to_string())?;
    let store = StoreHandle::from_store(Arc::new(s3), "", "s3://bucket/");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    let objects = runtime
        .block_on(super::list(&store, None))
        .map_err(|e| e.to_string())?;
    Ok(objects.into_iter().map(|o| o.key).collect())
}

#[derive(Debug)]
struct PageConnector {
    page: Bytes,
}

impl HttpConnector for PageConnector {
    fn connect(&self, _: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(PageService {
            page: self.page.clone(),
            served: AtomicBool::new(false),
        }))
    }
}

#[derive(Debug)]
struct PageService {
    page: Bytes,
    served: AtomicBool,
}

#[async_trait::async_trait]
impl HttpService for PageService {
    async fn call(&self, _: HttpRequest) -> Result<HttpResponse, HttpError> {
        let body = if self.served.swap(true, Ordering::Relaxed) {
            Bytes::from_static(LAST_PAGE.as_bytes())
        } else {
            self.page.clone()
        };
        let mut response = HttpResponse::new(HttpResponseBody::from(body));
        *response.status_mut() = http::StatusCode::OK;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::s3_page_keys;

    fn page(keys: &[&str]) -> Vec<u8> {
        let mut xml = String::from("<ListBucketResult><IsTruncated>false</IsTruncated>");
        for k in keys {
            xml.push_str(&format!(
                "<Contents><Key>{k}</Key><Size>3</Size><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>\"e\"</ETag></Contents>"
            ));
        }
        xml.push_str("</ListBucketResult>");
        xml.into_bytes()
    }

    #[test]
    fn a_page_gives_its_keys_in_order() {
        assert_eq!(
            s3_page_keys(&page(&["b", "a/c"])),
            Ok(vec!["a/c".into(), "b".into()])
        );
    }

    #[test]
    fn a_page_that_is_not_xml_or_has_a_bad_key_is_an_error() {
        assert!(s3_page_keys(b"<ListBucketResult><Contents>").is_err());
        let e = s3_page_keys(&page(&["a&#1;b"])).unwrap_err();
        assert!(e.contains("a\\u{1}b") || e.contains("invalid"), "{e}");
    }
}
