<#--
  The CAPTCHA step of authpipe's browser flow (issue 47): shown after the username, before the
  password, when the edge answers challenge = "captcha". The authenticator renders it with
  context.form().setAttribute("altchaChallenge", verifier.newChallengeJson())
         .createForm("authpipe-captcha.ftl")
  and reads the posted field "authpipe-captcha" (the widget's payload) in action().
-->
<#import "template.ftl" as layout>
<#import "authpipe-altcha.ftl" as altcha>
<@layout.registrationLayout displayMessage=true; section>
  <#if section = "header">
    ${msg("loginAccountTitle")}
  <#elseif section = "form">
    <form id="kc-authpipe-captcha-form" class="${properties.kcFormClass!}" action="${url.loginAction}" method="post">
      <div class="${properties.kcFormGroupClass!}">
        <@altcha.widget challenge=altchaChallenge />
      </div>
      <div id="kc-form-buttons" class="${properties.kcFormButtonsClass!}">
        <input class="${properties.kcButtonClass!} ${properties.kcButtonPrimaryClass!} ${properties.kcButtonBlockClass!} ${properties.kcButtonLargeClass!}"
               name="login" id="kc-login" type="submit" value="${msg("doContinue")}"/>
      </div>
    </form>
  </#if>
</@layout.registrationLayout>
