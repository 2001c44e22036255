//! `--endpoint-url`, `--region`, `--no-sign-request`: how `s3://` inputs
//! are reached, for every command that takes a file (the AWS variables and
//! profile files apply beneath them: see `qemfs::remote::options`).

use clap::Args;
use qemfs::remote::StoreOptions;

#[derive(Debug, Clone, Default, Args, serde::Serialize, serde::Deserialize)]
pub struct RemoteArgs {
    /// S3-compatible server for s3:// URLs, addressed path-style (else
    /// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url,
    /// or AWS itself)
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// Region of s3:// URLs (else AWS_REGION, the profile's region, or
    /// us-east-1)
    #[arg(long, global = true, value_name = "REGION")]
    pub region: Option<String>,
    /// Send s3:// requests unsigned, for public buckets (no credentials
    /// needed)
    #[arg(long, global = true)]
    pub no_sign_request: bool,
}

impl RemoteArgs {
    /// Makes these the process's options for remote sources.
    pub fn apply(&self) {
        let mut options = StoreOptions::default();
        options.endpoint_url = self.endpoint_url.clone();
        options.region = self.region.clone();
        options.no_sign_request = self.no_sign_request;
        qemfs::remote::options::configure(options);
    }
}
