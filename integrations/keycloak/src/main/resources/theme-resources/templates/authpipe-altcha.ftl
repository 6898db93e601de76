<#ftl output_format="HTML">
<#--
  authpipe's ALTCHA widget (issue 47): the self-hosted proof-of-work CAPTCHA the edge asks for
  with challenge = "captcha". Import it into a login page and call the macro inside the form:

    <#import "authpipe-altcha.ftl" as altcha>
    <@altcha.widget challenge=altchaChallenge />

  challenge: AltchaVerifier.newChallengeJson() (a form attribute the authenticator sets), here
  HTML-escaped into the attribute, which the browser reads back as the JSON. The widget solves
  it as the page loads (auto="onload") and puts its payload in the form field `name`
  ("authpipe-captcha", what the authenticator passes to CaptchaVerifier.verify). Its script
  comes from this jar (theme-resources/resources/altcha/altcha.min.js, vendored from npm by
  scripts/altcha-widget), never from a CDN. The widget needs a secure context: HTTPS, or
  localhost.
-->
<#macro widget challenge name="authpipe-captcha">
<script type="module" src="${url.resourcesPath}/altcha/altcha.min.js"></script>
<altcha-widget name="${name}" auto="onload" challenge="${challenge}"></altcha-widget>
</#macro>
